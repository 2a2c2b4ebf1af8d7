package httpapi

import (
	"context"
	"errors"
)

// SetAfterClaim sets the hook run when a claim has its tasks, before its
// answer is written, until the returned func restores it.
func SetAfterClaim(f func(ctx context.Context, q string)) (restore func()) {
	old := afterClaim.Swap(&f)
	return func() { afterClaim.Store(old) }
}

// StatusOf is the HTTP status the API answers err with.
func StatusOf(err error) int {
	var p *Problem
	if errors.As(problem(err, nil), &p) {
		return p.Status
	}
	return 0
}

// BulkRoutes are the operation ids bound as bulk routes by name.
var BulkRoutes = bulkRoutes

// SessionIDPattern is the pattern of the session routes' path.id.
const SessionIDPattern = sessionIDPattern

// SetBeforeStream sets the hook run as a stream starts, until the
// returned func restores it.
func SetBeforeStream(f func(ctx context.Context)) (restore func()) {
	old := beforeStream.Swap(&f)
	return func() { beforeStream.Store(old) }
}

// NamespaceOf is the namespace a request's context was authorized for.
func NamespaceOf(ctx context.Context) string { ns, _ := ctx.Value(nsKey).(string); return ns }

// SetAfterGrant sets the hook run when a request was granted a lease,
// until the returned func restores it.
func SetAfterGrant(f func(ctx context.Context)) (restore func()) {
	old := afterGrant.Swap(&f)
	return func() { afterGrant.Store(old) }
}

// StallDecisions feeds probe outcomes to a new stall count and returns,
// for each, whether etcd was called stalled.
func StallDecisions(errs ...error) []bool {
	var c stallCount
	out := make([]bool, len(errs))
	for i, err := range errs {
		out[i] = c.note(err)
	}
	return out
}

// RetryAfterOf is the Retry-After header the API answers err with.
func RetryAfterOf(err error) string {
	var p *Problem
	if errors.As(problem(err, nil), &p) {
		return p.headers.Get("Retry-After")
	}
	return ""
}

// BulkAllowance is the time a bulk route gets beyond the request timeout.
const BulkAllowance = bulkAllowance
