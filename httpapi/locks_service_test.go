package httpapi_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLockServiceSessionLockNotOwners: a lock taken under a session shows
// its owner (the session's name, or "http-session") and token to anyone;
// they do not prove its holding, so /locks neither renews it onto a lease
// of its own (which would outlive the session) nor releases it, and it
// ends with its session. An owner lock of /v1/locks is renewed and
// released through /locks by its owner and token.
func TestLockServiceSessionLockNotOwners(t *testing.T) {
	a := newAPI(t)
	sid := a.do("POST", "/v1/sessions", map[string]any{"ttl": 30}).want(t, 201).str("id")
	a.do("POST", "/v1/locks/victim", map[string]any{"session": sid}).want(t, 200)
	g := a.do("GET", "/locks/victim", nil).want(t, 200)
	owner, tok := g.str("owner"), int64(g.num("token"))
	if owner == "" || tok == 0 {
		t.Fatalf("GET /locks/victim: %s", g.Raw)
	}
	proof := map[string]any{"owner": owner, "token": tok}
	if r := a.do("POST", "/locks/victim/renew", map[string]any{"owner": owner, "token": tok, "ttl": 3600}).want(t, 409); !strings.HasPrefix(r.str("error"), "Not the lock holder") {
		t.Fatalf("renew of a session's lock: %s", r.Raw)
	}
	a.do("DELETE", "/locks/victim", proof).want(t, 409)
	if st := a.do("GET", "/v1/locks/victim", nil).want(t, 200); int64(st.num("token")) != tok {
		t.Fatalf("after the refused renew and release: %s", st.Raw)
	}
	a.do("DELETE", "/v1/sessions/"+sid, nil).want(t, 204)
	a.do("GET", "/locks/victim", nil).want(t, 404)

	// A worker holding a lock on etcd directly, on a lease of its own
	// with no other key: its record names its host and pid, and its
	// owner and token do not prove it either.
	ctx := context.Background()
	w, err := lock.NewEtcd(ctx, a.cli, lock.EtcdConfig{Namespace: a.ns, TTL: 30 * time.Second, HolderID: "cli-worker"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close(ctx) }()
	held, err := w.TryAcquireFenced(ctx, "direct")
	if err != nil {
		t.Fatal(err)
	}
	a.do("POST", "/locks/direct/renew", map[string]any{"owner": "cli-worker", "token": held.Token(), "ttl": 3600}).want(t, 409)
	a.do("DELETE", "/locks/direct", map[string]any{"owner": "cli-worker", "token": held.Token()}).want(t, 409)
	if g := a.do("GET", "/locks/direct", nil).want(t, 200); int64(g.num("token")) != held.Token() || g.num("ttl") > 30 {
		t.Fatalf("after the refused renew and release: %s", g.Raw)
	}

	r := a.do("POST", "/v1/locks/owned", map[string]any{"owner": "worker-9", "ttl": 30}).want(t, 200)
	own := map[string]any{"owner": "worker-9", "token": int64(r.num("token"))}
	a.do("POST", "/locks/owned/renew", map[string]any{"owner": "worker-9", "token": own["token"], "ttl": 60}).want(t, 200)
	a.do("DELETE", "/locks/owned", own).want(t, 200)
	a.do("GET", "/locks/owned", nil).want(t, 404)
}

// TestLockServiceIdempotentAcquire: an acquisition sent twice with the
// same Idempotency-Key (its first answer lost) gets the same grant; the
// same owner with another key, or none, and another owner with the key,
// get 409. The record keeps no key in clear.
func TestLockServiceIdempotentAcquire(t *testing.T) {
	a := newAPI(t)
	body := map[string]any{"owner": "worker-7", "ttl": 30, "holder": map[string]any{"task": "t-1"}}
	first := a.do("POST", "/locks/build", body, "Idempotency-Key: build-req-1").want(t, 200)
	again := a.do("POST", "/locks/build", body, "Idempotency-Key: build-req-1").want(t, 200)
	if string(first.Raw) != string(again.Raw) {
		t.Fatalf("a repeat answered another grant:\nfirst %s\nagain %s", first.Raw, again.Raw)
	}
	a.do("POST", "/locks/build", body, "Idempotency-Key: build-req-2").want(t, 409)
	a.do("POST", "/locks/build", body).want(t, 409)
	a.do("POST", "/locks/build", map[string]any{"owner": "worker-8", "ttl": 30}, "Idempotency-Key: build-req-1").want(t, 409)
	g, err := a.cli.Get(context.Background(), "/"+a.ns+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range g.Kvs {
		if strings.Contains(string(kv.Value), "build-req-1") {
			t.Fatalf("key %s holds the Idempotency-Key: %s", kv.Key, kv.Value)
		}
	}
}

// faultKV passes every call to etcd; a transaction whose writes name the
// lock failAfter names answers an error once it has applied, as a commit
// whose answer was lost does.
type faultKV struct {
	clientv3.KV
	failAfter atomic.Pointer[string]
}

func (f *faultKV) Txn(ctx context.Context) clientv3.Txn { return &faultTxn{Txn: f.KV.Txn(ctx), kv: f} }

type faultTxn struct {
	clientv3.Txn
	kv   *faultKV
	fail bool
}

func (x *faultTxn) If(cs ...clientv3.Cmp) clientv3.Txn { x.Txn = x.Txn.If(cs...); return x }
func (x *faultTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	x.Txn = x.Txn.Else(ops...)
	return x
}

func (x *faultTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	if name := x.kv.failAfter.Load(); name != nil {
		for _, op := range ops {
			if op.IsPut() && strings.Contains(string(op.KeyBytes()), "/"+*name+"/") {
				x.fail = true
			}
		}
	}
	x.Txn = x.Txn.Then(ops...)
	return x
}

func (x *faultTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := x.Txn.Commit()
	if err == nil && x.fail {
		x.kv.failAfter.Store(nil)
		return nil, context.DeadlineExceeded
	}
	return resp, err
}

// countLease passes every call to etcd, counting TimeToLive calls and
// revocations without a deadline.
type countLease struct {
	clientv3.Lease
	ttls, unbounded atomic.Int64
}

func (c *countLease) TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error) {
	c.ttls.Add(1)
	return c.Lease.TimeToLive(ctx, id, opts...)
}

func (c *countLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	if _, ok := ctx.Deadline(); !ok {
		c.unbounded.Add(1)
	}
	return c.Lease.Revoke(ctx, id)
}

// faultAPI is a server whose etcd client is wrapped in faultKV and
// countLease.
func faultAPI(t *testing.T) (*api, *faultKV, *countLease) {
	cli := srv.LocalClient(t)
	kv, ls := &faultKV{KV: cli.KV}, &countLease{Lease: cli.Lease}
	cli.KV, cli.Lease = kv, ls
	return newAPI(t, func(c *httpapi.Config) { c.Etcd = cli }), kv, ls
}

// TestLockServiceLostCommit: an acquisition or a renewal whose commit
// applied but answered an error is found applied (the lock is the
// request's, the renewal's new lease lives) rather than undone by
// revoking the lease the key is now bound to.
func TestLockServiceLostCommit(t *testing.T) {
	a, kv, _ := faultAPI(t)
	name := "acquire-lost"
	kv.failAfter.Store(&name)
	r := a.do("POST", "/locks/acquire-lost", map[string]any{"owner": "w", "ttl": 30}).want(t, 200)
	if g := a.do("GET", "/locks/acquire-lost", nil).want(t, 200); g.num("token") != r.num("token") {
		t.Fatalf("acquired %s, then held with %s", r.Raw, g.Raw)
	}
	r = a.do("POST", "/locks/renew-lost", map[string]any{"owner": "w", "ttl": 30}).want(t, 200)
	tok := r.num("token")
	name = "renew-lost"
	kv.failAfter.Store(&name)
	rn := a.do("POST", "/locks/renew-lost/renew", map[string]any{"owner": "w", "token": tok, "ttl": 600}).want(t, 200)
	if kv.failAfter.Load() != nil {
		t.Fatal("the renewal's commit was not made to fail")
	}
	g := a.do("GET", "/locks/renew-lost", nil).want(t, 200)
	if g.num("token") != tok || rn.num("token") != tok || g.num("ttl") <= 30 {
		t.Fatalf("renewed %s, then %s: want the same token on the new lease", rn.Raw, g.Raw)
	}
}

// TestLockServiceRevokesBounded: every lease /locks gives back (a grant
// that lost, a renewal's old lease, a release's) is revoked with a
// deadline, so an etcd that does not answer cannot hold a request for
// ever.
func TestLockServiceRevokesBounded(t *testing.T) {
	a, _, ls := faultAPI(t)
	r := a.do("POST", "/locks/bounded", map[string]any{"owner": "w", "ttl": 30}).want(t, 200)
	a.do("POST", "/locks/bounded", map[string]any{"owner": "x", "ttl": 30}).want(t, 409)
	tok := r.num("token")
	a.do("POST", "/locks/bounded/renew", map[string]any{"owner": "w", "token": tok, "ttl": 30}).want(t, 200)
	a.do("DELETE", "/locks/bounded", map[string]any{"owner": "w", "token": tok}).want(t, 200)
	if n := ls.unbounded.Load(); n != 0 {
		t.Fatalf("%d lease revocations without a deadline", n)
	}
}

// TestLockServiceListReadsEachLeaseOnce: GET /locks reads each lease's
// time left once, however many locks share it (a session's do).
func TestLockServiceListReadsEachLeaseOnce(t *testing.T) {
	a, _, ls := faultAPI(t)
	sid := a.session(30)
	for i := range 4 {
		a.do("POST", fmt.Sprintf("/v1/locks/shared-%d", i), map[string]any{"session": sid}).want(t, 200)
	}
	a.do("POST", "/locks/own-1", map[string]any{"owner": "w", "ttl": 30}).want(t, 200)
	a.do("POST", "/locks/own-2", map[string]any{"owner": "w", "ttl": 30}).want(t, 200)
	before := ls.ttls.Load()
	l := a.do("GET", "/locks", nil).want(t, 200)
	if n := ls.ttls.Load() - before; n != 3 {
		t.Fatalf("GET /locks read leases %d times, want 3 (a session's and two owner locks'): %s", n, l.Raw)
	}
	if data, _ := l.JSON["data"].([]any); len(data) != 6 {
		t.Fatalf("list: %s", l.Raw)
	}
}
