package lock

import (
	"context"
	"errors"
	"time"

	"github.com/droverhq/drover/tracing/otelspan"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// AcquireFenced is Acquire returning the etcd lock itself, which is a
// lease.Fence: its Txn fences etcd writes by the lock. Inside a span that
// records (an attempt's, say) it makes a "lock acquire" span, and a
// "lock wait" span within it for the time it waited in line.
func (e *Etcd) AcquireFenced(ctx context.Context, name string) (*EtcdLock, error) {
	ctx, span := otelspan.StartLock(ctx, name)
	var waitFrom time.Time
	l, err := e.acquireFenced(ctx, name, &waitFrom)
	if l == nil {
		endLock(ctx, span, name, nil, waitFrom, err)
		return nil, err
	}
	endLock(ctx, span, name, l, waitFrom, err)
	return l, err
}

// TryAcquireFenced is TryAcquire returning the etcd lock itself, which is a
// lease.Fence: its Txn fences etcd writes by the lock. Inside a span that
// records it makes a "lock acquire" span (drover.lock.waited=false: a try
// never waits). A lock held by another is an answer, not a failure (callers
// try, then wait with Acquire): the span says drover.lock.held=true and
// ends without an error; other errors end it with theirs.
func (e *Etcd) TryAcquireFenced(ctx context.Context, name string) (*EtcdLock, error) {
	ctx, span := otelspan.StartLock(ctx, name)
	l, err := e.tryAcquireFenced(ctx, name)
	if l == nil {
		spanErr := err
		if errors.Is(err, ErrHeld) {
			span.SetAttributes(attrLockHeld)
			spanErr = nil
		}
		endLock(ctx, span, name, nil, time.Time{}, spanErr)
		return nil, err
	}
	endLock(ctx, span, name, l, time.Time{}, err)
	return l, err
}

// attrLockHeld marks a try that found the lock held by another.
var attrLockHeld = attribute.Bool("drover.lock.held", true)

// endLock ends an acquisition's span: the wait in line from waitFrom
// (zero: none) to now, then the span, with l's token.
func endLock(ctx context.Context, span trace.Span, name string, l Lock, waitFrom time.Time, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	waited := !waitFrom.IsZero()
	if waited {
		otelspan.LockWait(ctx, span, name, waitFrom, time.Now())
	}
	var token int64
	if l != nil {
		token = l.Token()
	}
	otelspan.EndLock(span, waited, token, err)
}

// setNow sets *t to now and reports true.
func setNow(t *time.Time) bool {
	*t = time.Now()
	return true
}
