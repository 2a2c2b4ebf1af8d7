package httpapi

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// heldLock is an etcd lock that a client holds under its session across
// requests (a lock of POST /v1/locks/{name}, an agent task's claim), proved
// by the session and the fencing token. It is the fence of the writes the
// client makes under it: each commits only while the lock's key still
// exists with the token as its create revision. A key bound to a session
// is deleted by etcd when the session ends, so a write after that, or after
// a release, is refused in the same transaction that would apply it.
type heldLock struct {
	cli    *clientv3.Client
	name   string
	key    string
	token  int64
	holder lock.Holder
}

var _ lease.Fence = (*heldLock)(nil)

// Token is the lock's fencing token.
func (h *heldLock) Token() int64 { return h.token }

// Txn starts a transaction that commits only while the lock is held with
// the token; otherwise Commit returns an error matching lease.ErrFenced.
func (h *heldLock) Txn(ctx context.Context) clientv3.Txn {
	return lease.NewFencedTxn(ctx, h.cli, lease.Spec{
		Name:  fmt.Sprintf("lock %q", h.name),
		Token: h.token,
		Cmp:   clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.token),
	})
}

// Context is never cancelled: the server does not watch a client's lock
// between requests; Txn's compare is what fences.
func (h *heldLock) Context() context.Context { return context.Background() }

// Err is nil: a loss is found by Txn's compare, not known beforehand.
func (h *heldLock) Err() error { return nil }

// heldLock finds lock name held with token under session (the hex id, at
// location for errors): a 409 (fenced) unless its holder's key has that
// create revision and is bound to that session.
func (s *Server) heldLock(ctx context.Context, name string, token int64, session, location string) (*heldLock, error) {
	id, err := s.sessionLease(ctx, location, session)
	if err != nil {
		return nil, err
	}
	if err := lock.CheckName(name); err != nil {
		return nil, problem(err, map[string]string{"name": "body.lock"})
	}
	g, err := s.cli.Get(ctx, s.keys(ctx).Lock(name), clientv3.WithFirstCreate()...)
	if err != nil {
		return nil, problem(fmt.Errorf("read lock %q: %w", name, err), nil)
	}
	if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != token || g.Kvs[0].Lease != int64(id) {
		now := "it is free"
		if len(g.Kvs) > 0 {
			now = fmt.Sprintf("it is held with token %d", g.Kvs[0].CreateRevision)
		}
		return nil, problem(fmt.Errorf("%w: lock %q is not held with token %d under session %s (%s)", lease.ErrFenced, name, token, redact(session), now), nil)
	}
	kv := g.Kvs[0]
	h := &heldLock{cli: s.cli, name: name, key: string(kv.Key), token: token}
	_ = json.Unmarshal(kv.Value, &h.holder)
	return h, nil
}
