package stream

import (
	"context"
	"errors"
	"sync"
)

// outboxEvents and outboxBytes bound an attempt's events queued and not
// yet sent: an Emit past them waits for the writes before.
const (
	outboxEvents = 1000
	outboxBytes  = 512 << 10
)

// outbox is an attempt's events emitted and not yet sent. A goroutine
// sends them while there are any, all that came since its last write in
// its next, and ends when none is left: a stream emitting faster than a
// write takes has several events in each chunk. The zero value is ready.
type outbox struct {
	mu      sync.Mutex
	queued  []Input
	bytes   int
	sending bool
	err     error         // a write fenced or over a cap: every later Emit and Flush gets it
	failed  error         // a write that failed otherwise (etcd): the next Emit or Flush gets it, once
	changed chan struct{} // closed (and replaced) when a write ends
}

// put queues ins, waiting while the outbox is full, and starts the
// sender if none runs.
func (o *outbox) put(ctx context.Context, ins []Input, send func([]Input) error) error {
	n := 0
	for _, in := range ins {
		n += in.size()
	}
	o.mu.Lock()
	for o.err == nil && len(o.queued) > 0 && (len(o.queued)+len(ins) > outboxEvents || o.bytes+n > outboxBytes) {
		ch := o.wait()
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		o.mu.Lock()
	}
	defer o.mu.Unlock()
	if err := o.takeErr(); err != nil {
		return err
	}
	o.queued = append(o.queued, ins...)
	o.bytes += n
	if !o.sending {
		o.sending = true
		go o.run(send)
	}
	return nil
}

// wait returns a channel closed when a write ends. o.mu is held.
func (o *outbox) wait() <-chan struct{} {
	if o.changed == nil {
		o.changed = make(chan struct{})
	}
	return o.changed
}

// run sends the queued events until none is left or a write failed.
func (o *outbox) run(send func([]Input) error) {
	for {
		o.mu.Lock()
		batch := o.queued
		if len(batch) == 0 || o.err != nil {
			o.queued, o.bytes, o.sending = nil, 0, false
			o.signal()
			o.mu.Unlock()
			return
		}
		o.queued, o.bytes = nil, 0
		o.mu.Unlock()
		err := send(batch)
		o.mu.Lock()
		switch {
		case err == nil:
		case errors.Is(err, ErrFenced) || errors.Is(err, ErrStreamFull):
			if o.err == nil {
				o.err = err
			}
		case o.failed == nil:
			o.failed = err // its events may or may not be stored; the next ones are tried
		}
		o.signal()
		o.mu.Unlock()
	}
}

// signal wakes the waiters of o.changed. o.mu is held.
func (o *outbox) signal() {
	if o.changed != nil {
		close(o.changed)
		o.changed = nil
	}
}

// takeErr returns the error a caller is to get: the sticky one, else a
// failed write's, once. o.mu is held.
func (o *outbox) takeErr() error {
	if o.err != nil {
		return o.err
	}
	err := o.failed
	o.failed = nil
	return err
}

// flush waits until nothing is queued or being sent, and returns the
// error of a write: one fenced or over a cap, or, once, one that failed
// otherwise.
func (o *outbox) flush(ctx context.Context) error {
	o.mu.Lock()
	for o.sending {
		ch := o.wait()
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		o.mu.Lock()
	}
	defer o.mu.Unlock()
	return o.takeErr()
}
