package httpapi

import (
	"context"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// cleanupTimeout bounds a cleanup a request does once its work failed
// (revoking the lease it granted, releasing what it claimed): it runs even
// when the request's own context has ended, and must not keep the request
// much longer than its bound when etcd does not answer. What a cleanup
// leaves undone ends with its lease's TTL.
const cleanupTimeout = 2 * time.Second

// cleanupContext is the context of a cleanup after ctx's work: not
// cancelled with ctx, and bounded by cleanupTimeout.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// revokeGranted revokes a lease the request granted and will not use,
// within cleanupTimeout; if etcd does not answer, the lease expires with
// its TTL.
func (s *Server) revokeGranted(ctx context.Context, id clientv3.LeaseID) {
	c, cancel := cleanupContext(ctx)
	defer cancel()
	_, _ = s.cli.Revoke(c, id)
}

// grant grants a lease of ttl seconds for the request.
func (s *Server) grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	g, err := s.cli.Grant(ctx, ttl)
	if err == nil {
		if hook := afterGrant.Load(); hook != nil {
			(*hook)(ctx)
		}
	}
	return g, err
}

// afterGrant, when set (by tests), runs when a request was granted a
// lease.
var afterGrant atomic.Pointer[func(ctx context.Context)]
