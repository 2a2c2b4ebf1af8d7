package httpapi

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/paxos"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// The lock service's routes (/locks), served by the Paxos nodes' own
// logic (paxos.LockService) on the etcd lock table: the same requests
// get the same answers from drover server as from drover paxos serve, and
// the locks are the ones /v1/locks shows.

// serviceRecord is the value of a lock taken through /locks: the holder
// record every lock has, the holder object the request gave, and what
// marks it as an owner lock and lets a repeated request find its grant.
type serviceRecord struct {
	lock.Holder
	Meta json.RawMessage `json:"meta,omitempty"`
	// Kind is ownerKind: the lock was taken with an owner and a ttl,
	// which with the token prove its holding.
	Kind string `json:"kind,omitempty"`
	// Request is the digest of the acquisition's Idempotency-Key, when
	// it had one (requestDigest).
	Request string `json:"request,omitempty"`
	// Expires is when the grant ends as its answer said (Unix ms): a
	// repeat of the request is answered the same.
	Expires int64 `json:"expires,omitempty"`
}

// ownerKind is the Kind of an owner lock's record.
const ownerKind = "owner"

// cleanupTimeout bounds giving back a lease once a request is done with
// it, which goes on after the request's own context may have ended: an
// etcd that does not answer must not hold the request for ever.
const cleanupTimeout = 5 * time.Second

// requestDigest is what a record keeps of a command's id (its
// Idempotency-Key): enough to know a repeat, and not the key itself.
func requestDigest(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:16])
}

// serviceLockInput is a request to a lock route with a body: read raw,
// whatever its Content-Type, as the nodes read it.
type serviceLockInput struct {
	ID      string `path:"id" doc:"The lock's id."`
	Key     string `header:"Idempotency-Key" doc:"Names the request: an acquisition sent again with the same key and owner while its grant holds the lock is answered with that grant."`
	RawBody []byte
}

type serviceReadInput struct {
	ID string `path:"id" doc:"The lock's id."`
}

type serviceOutput struct {
	Status int
	Body   any
}

func (s *Server) serviceLockRoutes() {
	svc := &paxos.LockService{Proposer: etcdTable{s}, Logger: s.cfg.Logger, CheckID: func(id string) string {
		if keyspace.IsTaskLock(id) {
			return `lock id must not start with "task:": agent tasks are claimed with POST /v1/agent-tasks/{id}/claim`
		}
		return ""
	}}
	serve := func(ctx context.Context, route paxos.LockRoute, id string, body []byte, key string) (*serviceOutput, error) {
		ans := svc.Serve(ctx, paxos.LockRequest{Route: route, ID: id, Body: body, IdempotencyKey: key})
		return &serviceOutput{Status: ans.Status, Body: ans.Body}, nil
	}
	const note = " The lock service's API: the same requests and answers as a Paxos node's (see docs/paxos.md), on the locks of /v1/locks."
	withBody := func(route paxos.LockRoute) func(context.Context, *serviceLockInput) (*serviceOutput, error) {
		return func(ctx context.Context, in *serviceLockInput) (*serviceOutput, error) {
			return serve(ctx, route, in.ID, in.RawBody, in.Key)
		}
	}
	op := func(id, method, path, summary string) huma.Operation {
		return huma.Operation{OperationID: id, Method: method, Path: path, Tags: []string{"lock service"},
			Summary: summary, Description: summary + "." + note, MaxBodyBytes: 2 * paxos.MaxBodyBytes}
	}
	registerRaw(s.api, op("acquire-lock-service", http.MethodPost, "/locks/{id}", "Acquire a lock for owner for ttl seconds"),
		huma.Schema{Type: "object", Properties: map[string]*huma.Schema{"owner": {Type: "string"}, "ttl": {Type: "number"}, "holder": {Type: "object"}}},
		withBody(paxos.RouteAcquire))
	registerRaw(s.api, op("release-lock-service", http.MethodDelete, "/locks/{id}", "Release a lock its owner holds with token"),
		huma.Schema{Type: "object", Properties: map[string]*huma.Schema{"owner": {Type: "string"}, "token": {Type: "integer"}}},
		withBody(paxos.RouteRelease))
	registerRaw(s.api, op("renew-lock-service", http.MethodPost, "/locks/{id}/renew", "Renew a lock its owner holds with token for ttl seconds"),
		huma.Schema{Type: "object", Properties: map[string]*huma.Schema{"owner": {Type: "string"}, "token": {Type: "integer"}, "ttl": {Type: "number"}}},
		withBody(paxos.RouteRenew))
	huma.Register(s.api, op("get-lock-service", http.MethodGet, "/locks/{id}", "Who holds a lock"),
		func(ctx context.Context, in *serviceReadInput) (*serviceOutput, error) {
			return serve(ctx, paxos.RouteGet, in.ID, nil, "")
		})
	huma.Register(s.api, op("list-locks-service", http.MethodGet, "/locks", "Every held lock"),
		func(ctx context.Context, _ *struct{}) (*serviceOutput, error) {
			return serve(ctx, paxos.RouteList, "", nil, "")
		})
}

// registerRaw registers a route whose body the handler reads itself, as
// the Paxos nodes do: any Content-Type (curl -d sends none of JSON's),
// an empty body allowed. huma would check both for a RawBody, so the
// request body's description is set once it is registered; schema
// documents the body.
func registerRaw(api huma.API, op huma.Operation, schema huma.Schema, h func(context.Context, *serviceLockInput) (*serviceOutput, error)) {
	rb := &huma.RequestBody{Content: map[string]*huma.MediaType{}}
	op.RequestBody = rb
	huma.Register(api, op, h)
	rb.Required = false
	rb.Content = map[string]*huma.MediaType{"application/json": {Schema: &schema}}
}

// etcdTable applies the lock service's commands to the etcd lock table of
// the request's namespace. A grant's token is its key's create revision;
// a lock taken through /locks is bound to a lease of its own, granted for
// its ttl, rounded up to whole seconds as etcd counts them.
type etcdTable struct{ s *Server }

// Propose applies cmd.
func (t etcdTable) Propose(ctx context.Context, cmd paxos.Command) (paxos.Result, error) {
	var (
		res paxos.Result
		err error
	)
	switch cmd.Op {
	case paxos.OpAcquire:
		res, err = t.acquire(ctx, cmd)
	case paxos.OpGet:
		var kv *mvccpb.KeyValue
		if kv, err = t.first(ctx, cmd.Lock); err == nil && kv == nil {
			return paxos.Result{Code: paxos.CodeNotFound, Lock: paxos.LockState{Name: cmd.Lock}}, nil
		} else if err == nil {
			res = paxos.Result{Code: paxos.CodeOK, Lock: t.state(ctx, cmd.Lock, kv)}
		}
	case paxos.OpRelease, paxos.OpRenew:
		res, err = t.ownerTokenOp(ctx, cmd)
	case paxos.OpList:
		res, err = t.list(ctx)
	default:
		return paxos.Result{Code: paxos.CodeRejected, Err: fmt.Sprintf("unknown op %q", cmd.Op)}, nil
	}
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w: etcd did not answer: %w", paxos.ErrTimeout, err)
	}
	return res, err
}

func (t etcdTable) keys(ctx context.Context) keyspace.Space { return t.s.keys(ctx) }

// first is the holder's key of lock name, nil when it is free.
func (t etcdTable) first(ctx context.Context, name string) (*mvccpb.KeyValue, error) {
	g, err := t.s.cli.Get(ctx, t.keys(ctx).Lock(name), clientv3.WithFirstCreate()...)
	if err != nil || len(g.Kvs) == 0 {
		return nil, err
	}
	return g.Kvs[0], nil
}

// describe describes the holding kv of lock name from its record alone:
// its expiry is the end of time until expiry sets it.
func describe(name string, kv *mvccpb.KeyValue) paxos.LockState {
	var rec serviceRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		rec.ID = "unknown (unreadable record)"
	}
	// A key without a lease (none of drover's) would never expire: it
	// is shown as expiring at the end of time.
	st := paxos.LockState{Name: name, Owner: rec.ID, Token: uint64(kv.CreateRevision), Acquired: rec.AcquiredAt.UnixMilli(),
		Expires: math.MaxInt64 / 2}
	if len(rec.Meta) > 0 {
		st.Meta = string(rec.Meta)
	}
	return st
}

// expiry is when lease l ends (Unix ms), or 0 when that is not known (no
// lease, or etcd did not say).
func (t etcdTable) expiry(ctx context.Context, l int64) int64 {
	if l == 0 {
		return 0
	}
	ttl, err := t.s.cli.TimeToLive(ctx, clientv3.LeaseID(l))
	if err != nil || ttl.TTL < 0 {
		return 0
	}
	return time.Now().Add(time.Duration(ttl.TTL) * time.Second).UnixMilli()
}

// state describes the holding kv of lock name; its expiry is its lease's
// time left.
func (t etcdTable) state(ctx context.Context, name string, kv *mvccpb.KeyValue) paxos.LockState {
	st := describe(name, kv)
	if exp := t.expiry(ctx, kv.Lease); exp != 0 {
		st.Expires = exp
	}
	return st
}

// grant grants a lease for ttl milliseconds and returns it and when it
// ends.
func (t etcdTable) grant(ctx context.Context, ttlMS int64) (clientv3.LeaseID, int64, error) {
	sent := time.Now()
	g, err := t.s.grant(ctx, (ttlMS+999)/1000)
	if err != nil {
		return 0, 0, fmt.Errorf("grant the lock's lease: %w", err)
	}
	return g.ID, sent.Add(time.Duration(g.TTL) * time.Second).UnixMilli(), nil
}

// acquire takes cmd.Lock for cmd.Owner on a lease of its own, if it is
// free; a repeat of the request that took it (same owner and key) gets
// the same grant.
func (t etcdTable) acquire(ctx context.Context, cmd paxos.Command) (paxos.Result, error) {
	id, expires, err := t.grant(ctx, cmd.TTL)
	if err != nil {
		return paxos.Result{}, err
	}
	now := time.Now()
	rec := serviceRecord{Holder: lock.Holder{ID: cmd.Owner, AcquiredAt: now.UTC()}, Kind: ownerKind, Expires: expires}
	if cmd.ID != "" {
		rec.Request = requestDigest(cmd.ID)
	}
	if cmd.Meta != "" {
		rec.Meta = json.RawMessage(cmd.Meta)
		var who struct {
			Host string `json:"host"`
			PID  int    `json:"pid"`
		}
		_ = json.Unmarshal(rec.Meta, &who)
		rec.Host, rec.PID = who.Host, who.PID
	}
	val, _ := json.Marshal(rec)
	ks := t.keys(ctx)
	prefix := ks.Lock(cmd.Lock)
	key := ks.LockContender(cmd.Lock, keyspace.ContenderName(keyspace.ContenderPrefix(int64(id), strings.ToLower(crand.Text())), 0))
	resp, err := t.s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithPrefix()).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(id))).
		Else(clientv3.OpGet(prefix, clientv3.WithFirstCreate()...)).Commit()
	granted := paxos.Result{Code: paxos.CodeOK, Lock: paxos.LockState{Name: cmd.Lock, Owner: cmd.Owner,
		Acquired: now.UnixMilli(), Expires: expires, Meta: cmd.Meta}}
	if err != nil {
		// A commit that failed may have applied all the same: then the
		// key is there, and the lock is the request's.
		if kv, rerr := t.reread(ctx, key); rerr == nil && kv != nil && kv.Lease == int64(id) {
			granted.Lock.Token = uint64(kv.CreateRevision)
			return granted, nil
		}
		t.revoke(ctx, id, cmd.Lock)
		return paxos.Result{}, fmt.Errorf("acquire %q: %w", cmd.Lock, err)
	}
	if !resp.Succeeded {
		t.revoke(ctx, id, cmd.Lock)
		res := paxos.Result{Code: paxos.CodeHeld, Lock: paxos.LockState{Name: cmd.Lock}}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			if again, ok := repeated(cmd, kvs[0]); ok {
				return again, nil
			}
			res.Lock = t.state(ctx, cmd.Lock, kvs[0])
		}
		return res, nil
	}
	granted.Lock.Token = uint64(resp.Header.Revision)
	return granted, nil
}

// repeated is the grant that holding kv answered, if it is the one that
// cmd, sent again (same owner and Idempotency-Key), made.
func repeated(cmd paxos.Command, kv *mvccpb.KeyValue) (paxos.Result, bool) {
	var rec serviceRecord
	if cmd.ID == "" || json.Unmarshal(kv.Value, &rec) != nil || rec.Kind != ownerKind || rec.ID != cmd.Owner ||
		rec.Request != requestDigest(cmd.ID) {
		return paxos.Result{}, false
	}
	return paxos.Result{Code: paxos.CodeOK, Lock: paxos.LockState{Name: cmd.Lock, Owner: rec.ID, Token: uint64(kv.CreateRevision),
		Acquired: rec.AcquiredAt.UnixMilli(), Expires: rec.Expires, Meta: string(rec.Meta)}}, true
}

// reread reads key again after a write whose outcome is not known, within
// cleanupTimeout of its own: nil when it is not there.
func (t etcdTable) reread(ctx context.Context, key string) (*mvccpb.KeyValue, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	g, err := t.s.cli.Get(cctx, key)
	if err != nil || len(g.Kvs) == 0 {
		return nil, err
	}
	return g.Kvs[0], nil
}

// revoke gives back lease l, which the request granted for lock name and
// no key of which holds it, within cleanupTimeout.
func (t etcdTable) revoke(ctx context.Context, l clientv3.LeaseID, name string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := t.s.cli.Revoke(cctx, l); err != nil {
		t.s.cfg.Logger.Warn("a lock's unused lease not revoked (it expires by itself)", "lock", name, "err", err)
	}
}

// ownerLock reports whether kv, whose record is rec, is the holding of an
// owner lock, which its owner and token prove: one taken through /locks
// (its record says so) or through /v1/locks with an owner and a ttl (its
// record names no host or pid, and its lease is its own: no other key is
// bound to it). A lock a session holds is not: its owner and token are
// shown to anyone, and only its session and contender prove it (a
// session's lease also holds the session's key); nor is one a worker
// holds on etcd directly (its record names its host and pid).
func (t etcdTable) ownerLock(ctx context.Context, kv *mvccpb.KeyValue, rec serviceRecord) (bool, error) {
	if rec.Kind == ownerKind {
		return true, nil
	}
	if kv.Lease == 0 || rec.Host != "" || rec.PID != 0 {
		return false, nil
	}
	ttl, err := t.s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease), clientv3.WithAttachedKeys())
	if err != nil {
		return false, err
	}
	return len(ttl.Keys) == 1 && string(ttl.Keys[0]) == string(kv.Key), nil
}

// ownerTokenOp releases or renews cmd.Lock if cmd.Owner holds it with
// cmd.Token as an owner lock. A renewal binds the holding's key to a new
// lease of the new ttl (the key, and so the token, stays).
func (t etcdTable) ownerTokenOp(ctx context.Context, cmd paxos.Command) (paxos.Result, error) {
	kv, err := t.first(ctx, cmd.Lock)
	if err != nil {
		return paxos.Result{}, fmt.Errorf("%s %q: %w", cmd.Op, cmd.Lock, err)
	}
	notHeld := func() paxos.Result {
		res := paxos.Result{Code: paxos.CodeNotHeld, Lock: paxos.LockState{Name: cmd.Lock}}
		if kv, err := t.first(ctx, cmd.Lock); err == nil && kv != nil {
			res.Lock = t.state(ctx, cmd.Lock, kv)
		}
		return res
	}
	var rec serviceRecord
	if kv == nil || uint64(kv.CreateRevision) != cmd.Token || json.Unmarshal(kv.Value, &rec) != nil || rec.ID != cmd.Owner {
		return notHeld(), nil
	}
	if own, err := t.ownerLock(ctx, kv, rec); err != nil {
		return paxos.Result{}, fmt.Errorf("%s %q: read its lease: %w", cmd.Op, cmd.Lock, err)
	} else if !own {
		return notHeld(), nil
	}
	key, old := string(kv.Key), clientv3.LeaseID(kv.Lease)
	same := clientv3.Compare(clientv3.CreateRevision(key), "=", kv.CreateRevision)
	if cmd.Op == paxos.OpRelease {
		resp, err := t.s.cli.Txn(ctx).If(same).Then(clientv3.OpDelete(key)).Commit()
		if err != nil {
			return paxos.Result{}, fmt.Errorf("release %q: %w", cmd.Lock, err)
		}
		if !resp.Succeeded {
			return notHeld(), nil
		}
		t.revokeOwn(ctx, old, cmd.Lock)
		return paxos.Result{Code: paxos.CodeOK, Lock: paxos.LockState{Name: cmd.Lock}}, nil
	}
	id, expires, err := t.grant(ctx, cmd.TTL)
	if err != nil {
		return paxos.Result{}, err
	}
	resp, err := t.s.cli.Txn(ctx).If(same).Then(clientv3.OpPut(key, string(kv.Value), clientv3.WithLease(id))).Commit()
	switch {
	case err != nil:
		// A commit that failed may have applied all the same: then the
		// key is on the new lease, which must live.
		now, rerr := t.reread(ctx, key)
		if rerr == nil && now != nil && now.CreateRevision == kv.CreateRevision && now.Lease == int64(id) {
			break
		}
		if rerr == nil {
			t.revoke(ctx, id, cmd.Lock)
		}
		return paxos.Result{}, fmt.Errorf("renew %q: %w", cmd.Lock, err)
	case !resp.Succeeded:
		t.revoke(ctx, id, cmd.Lock)
		return notHeld(), nil
	}
	t.revokeOwn(ctx, old, cmd.Lock)
	st := describe(cmd.Lock, kv)
	st.Expires = expires
	return paxos.Result{Code: paxos.CodeOK, Lock: st}, nil
}

// revokeOwn revokes lease l once the holding of lock name no longer uses
// it, if nothing else is bound to it (a lock's own lease, not a
// session's): otherwise it would live out its ttl. It takes at most
// cleanupTimeout, whatever ctx's deadline.
func (t etcdTable) revokeOwn(ctx context.Context, l clientv3.LeaseID, name string) {
	if l == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	ttl, err := t.s.cli.TimeToLive(cctx, l, clientv3.WithAttachedKeys())
	if err != nil || len(ttl.Keys) > 0 {
		return
	}
	if _, err := t.s.cli.Revoke(cctx, l); err != nil {
		t.s.cfg.Logger.Warn("lock released, its lease not revoked (it expires by itself)", "lock", name, "err", err)
	}
}

// listLeaseReads bounds how many leases a listing reads at once.
const listLeaseReads = 8

func (t etcdTable) list(ctx context.Context) (paxos.Result, error) {
	ks := t.keys(ctx)
	g, err := t.s.cli.Get(ctx, ks.Locks(), clientv3.WithPrefix())
	if err != nil {
		return paxos.Result{}, fmt.Errorf("list locks: %w", err)
	}
	first := map[string]*mvccpb.KeyValue{}
	for _, kv := range g.Kvs {
		name, ok := ks.LockName(string(kv.Key))
		if !ok {
			continue
		}
		if f, ok := first[name]; !ok || kv.CreateRevision < f.CreateRevision {
			first[name] = kv
		}
	}
	// Each lease is read once (a session's locks share one), a few at a
	// time.
	leases := map[int64]bool{}
	for _, kv := range first {
		leases[kv.Lease] = true
	}
	var (
		mu       sync.Mutex
		grp      errgroup.Group
		expiries = make(map[int64]int64, len(leases))
	)
	grp.SetLimit(listLeaseReads)
	for l := range leases {
		grp.Go(func() error {
			exp := t.expiry(ctx, l)
			mu.Lock()
			expiries[l] = exp
			mu.Unlock()
			return nil
		})
	}
	_ = grp.Wait()
	res := paxos.Result{Code: paxos.CodeOK, Locks: make([]paxos.LockState, 0, len(first))}
	for name, kv := range first {
		st := describe(name, kv)
		if exp := expiries[kv.Lease]; exp != 0 {
			st.Expires = exp
		}
		res.Locks = append(res.Locks, st)
	}
	sort.Slice(res.Locks, func(i, j int) bool { return res.Locks[i].Name < res.Locks[j].Name })
	return res, nil
}
