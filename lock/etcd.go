package lock

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultTTL is the lease TTL of an [Etcd] locker that is given neither a TTL
// nor a lease.
const DefaultTTL = 15 * time.Second

// cleanupTimeout bounds the deletion of an abandoned contender key.
const cleanupTimeout = 5 * time.Second

// EtcdConfig configures an [Etcd] locker. The zero value is valid.
type EtcdConfig struct {
	// Namespace of the keys; "" means "drover".
	Namespace string
	// TTL of the lease the locker grants for itself when Lease is nil.
	// Zero means DefaultTTL; otherwise it must be within 1 s and 24 h.
	TTL time.Duration
	// Lease, when set, is the lease every lock of this locker is bound to;
	// the locker does not close it. Use it to bind locks to a process's
	// primary lease.
	Lease *lease.Lease
	// HolderID names this worker in the lock records; "" means "host:pid".
	HolderID string
	// Holder, when its ID is set, is the lock records' holder instead of
	// this process (HolderID is then unused): a server that takes locks
	// on behalf of its clients names the client and its host.
	Holder Holder
	// Logger receives lease loss and lock loss; nil means slog.Default().
	Logger *slog.Logger
	// Batcher, when set, sends this locker's try-acquisitions and
	// releases together with those of the other lockers sharing it, in
	// fewer etcd requests (see Batcher); nil sends each alone.
	Batcher *Batcher
}

// Validate reports the first field that is not usable.
func (c EtcdConfig) Validate() error {
	if _, err := keyspace.New(c.Namespace); err != nil {
		return err
	}
	if c.Lease == nil && c.TTL != 0 {
		if err := lease.CheckTTL("ttl", c.TTL); err != nil {
			return err
		}
	}
	return nil
}

// Etcd is the etcd backend of [Locker]. Every lock it takes is bound to one
// lease, so all of them are lost together when the process dies.
type Etcd struct {
	cli       *clientv3.Client
	keys      keyspace.Space
	lease     *lease.Lease
	ownsLease bool
	holder    Holder
	logger    *slog.Logger
	batch     *Batcher
	// recordHead is the JSON of holder up to the acquired_at value.
	recordHead []byte

	// nonce starts every contender key of this locker: its lease ID and a
	// random part that tells it from other lockers sharing the lease.
	nonce string

	mu    sync.Mutex
	slots map[string]map[int]bool // lock name -> contender slots in use

	// stop ends the goroutines that retry deleting abandoned keys; Close
	// closes it and waits for them.
	stop     chan struct{}
	stopOnce sync.Once
	cleaners sync.WaitGroup
}

var _ Locker = (*Etcd)(nil)

// NewEtcd returns a locker on cli. Unless cfg.Lease is set it grants a lease
// with cfg.TTL, which Close revokes.
func NewEtcd(ctx context.Context, cli *clientv3.Client, cfg EtcdConfig) (*Etcd, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	keys := keyspace.MustNew(cfg.Namespace)
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	holder := NewHolder(cfg.HolderID)
	if cfg.Holder.ID != "" {
		holder = Holder{ID: cfg.Holder.ID, Host: cfg.Holder.Host, PID: cfg.Holder.PID}
	}
	e := &Etcd{cli: cli, keys: keys, lease: cfg.Lease, holder: holder, logger: logger, batch: cfg.Batcher,
		stop: make(chan struct{})}
	head, _ := json.Marshal(e.holder)
	// {"id":...,"pid":N,"acquired_at":"0001-..."} -> {"id":...,"pid":N,"acquired_at":
	e.recordHead = head[:bytes.LastIndex(head, []byte(`"acquired_at":`))+len(`"acquired_at":`)]
	if e.lease == nil {
		ttl := cfg.TTL
		if ttl == 0 {
			ttl = DefaultTTL
		}
		l, err := lease.Grant(ctx, cli, ttl, lease.WithLogger(logger))
		if err != nil {
			return nil, fmt.Errorf("lock: %w", err)
		}
		e.lease, e.ownsLease = l, true
	}
	// The random part (128 bits, crypto/rand) makes a holding's key a
	// secret of its holder: the HTTP API releases by it.
	e.nonce = keyspace.ContenderPrefix(int64(e.lease.ID()), strings.ToLower(crand.Text()))
	return e, nil
}

// Lease returns the lease the locker's locks are bound to.
func (e *Etcd) Lease() *lease.Lease { return e.lease }

// Close revokes the locker's own lease, which releases every lock it holds at
// once, then stops retrying the deletion of abandoned contender keys. A lease
// passed in EtcdConfig.Lease is left to its owner, and so are the locks bound
// to it.
func (e *Etcd) Close(ctx context.Context) error {
	var err error
	if e.ownsLease {
		err = e.lease.Close(ctx)
	}
	e.stopOnce.Do(func() { close(e.stop) })
	e.cleaners.Wait()
	return err
}

// contender returns this locker's key for a new attempt at name, and the
// function that gives the key back once the attempt or holding is over.
//
// Keys are reused: the lowest free slot of this lease for this name. etcd
// keeps every key ever written in its index until compaction, and range reads
// over a lock's prefix walk all of them, so a fresh key per attempt would make
// each acquisition slower than the last. Reuse is safe because the fence is
// the create revision, which a re-created key never repeats.
func (e *Etcd) contender(name string) (key string, done func(reusable bool)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.slots == nil {
		e.slots = map[string]map[int]bool{}
	}
	used := e.slots[name]
	if used == nil {
		used = map[int]bool{}
		e.slots[name] = used
	}
	slot := 0
	for used[slot] {
		slot++
	}
	used[slot] = true
	key = e.keys.LockContender(name, keyspace.ContenderName(e.nonce, slot))
	var once sync.Once
	return key, func(reusable bool) {
		once.Do(func() {
			if !reusable {
				return // the key may still exist: keep the slot out of use
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			delete(used, slot)
			if len(used) == 0 {
				delete(e.slots, name)
			}
		})
	}
}

// record returns the holder record for a holding taken at at, and its JSON.
// The part that never changes is encoded once, in NewEtcd.
func (e *Etcd) record(at time.Time) (Holder, string) {
	h := e.holder
	h.AcquiredAt = at.UTC()
	buf := make([]byte, 0, len(e.recordHead)+40)
	buf = append(buf, e.recordHead...)
	buf = h.AcquiredAt.AppendFormat(buf, `"`+time.RFC3339Nano+`"}`)
	return h, string(buf)
}

// TryAcquire takes name if, and only if, nobody holds it or waits for it, in
// one transaction: "if no key exists under the lock's prefix, create mine".
func (e *Etcd) TryAcquire(ctx context.Context, name string) (Lock, error) {
	l, err := e.TryAcquireFenced(ctx, name)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// tryAcquireFenced is TryAcquireFenced without its span.
func (e *Etcd) tryAcquireFenced(ctx context.Context, name string) (*EtcdLock, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := e.lease.Err(); err != nil {
		return nil, fmt.Errorf("lock: try-acquire %q: %w", name, err)
	}
	prefix := e.keys.Lock(name)
	key, done := e.contender(name)
	h, val := e.record(time.Now())
	resp, err := e.batch.txn(ctx, e.cli, name,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithPrefix()},
		[]clientv3.Op{clientv3.OpPut(key, val, clientv3.WithLease(e.lease.ID()))},
		[]clientv3.Op{clientv3.OpGet(prefix, clientv3.WithFirstCreate()...)})
	if err != nil {
		e.abandon(ctx, key, done)
		return nil, fmt.Errorf("lock: try-acquire %q: %w", name, err)
	}
	if !resp.Succeeded {
		done(true)
		herr := &HeldError{Name: name}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			herr.Holder, herr.Token = decodeHolder(kvs[0]), kvs[0].CreateRevision
		}
		return nil, herr
	}
	return e.newLock(name, key, resp.Header.Revision, h, done), nil
}

// Acquire queues for name and waits until every earlier contender is gone.
// It never polls: each waiter watches the one key just ahead of it.
func (e *Etcd) Acquire(ctx context.Context, name string) (Lock, error) {
	l, err := e.AcquireFenced(ctx, name)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// acquireFenced is AcquireFenced without its span; it sets *waitFrom to
// when it began to wait in line, when it did.
func (e *Etcd) acquireFenced(ctx context.Context, name string, waitFrom *time.Time) (*EtcdLock, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := e.lease.Err(); err != nil {
		return nil, fmt.Errorf("lock: acquire %q: %w", name, err)
	}
	prefix := e.keys.Lock(name)
	var (
		key   string
		done  func(bool)
		resp  *clientv3.TxnResponse
		ahead *mvccpb.KeyValue
	)
	h, val := e.record(time.Now())
	for {
		key, done = e.contender(name)
		// One round trip: take the lock outright when nobody holds or
		// waits for it (a bare put); otherwise queue up and learn the
		// contender just ahead. A key left over from an abandoned attempt
		// fails the inner compare and its slot is skipped.
		var err error
		resp, err = e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(
				clientv3.OpPut(key, val, clientv3.WithLease(e.lease.ID())),
				clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2), clientv3.WithKeysOnly()),
			).Commit()
		if err != nil {
			e.abandon(ctx, key, done)
			return nil, fmt.Errorf("lock: acquire %q: %w", name, err)
		}
		if resp.Succeeded {
			if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 1 {
				ahead = kvs[1]
			}
			break
		}
		done(false) // a key left behind by an abandoned attempt: skip its slot
	}
	token := resp.Header.Revision
	waited := ahead != nil && setNow(waitFrom)
	for ahead != nil {
		if err := e.waitDelete(ctx, ahead); err != nil {
			e.abandon(ctx, key, done)
			return nil, e.waitError(ctx, name, err)
		}
		g, err := e.cli.Get(ctx, prefix, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(token-1), clientv3.WithKeysOnly())...)
		if err != nil {
			e.abandon(ctx, key, done)
			return nil, e.waitError(ctx, name, err)
		}
		ahead = nil
		if len(g.Kvs) > 0 {
			ahead = g.Kvs[0]
		}
	}
	if waited {
		// Record when the lock was really taken; fenced, so a contender
		// whose lease ran out while it waited does not come back.
		h, val = e.record(time.Now())
		upd, err := e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", token)).
			Then(clientv3.OpPut(key, val, clientv3.WithLease(e.lease.ID()))).
			Commit()
		if err != nil {
			e.abandon(ctx, key, done)
			return nil, e.waitError(ctx, name, err)
		}
		if !upd.Succeeded {
			done(true)
			return nil, &LostError{Name: name, Token: token, Cause: errors.New("contender key vanished while waiting (lease expired?)")}
		}
	}
	return e.newLock(name, key, token, h, done), nil
}

// waitDelete returns once kv's key is deleted, ctx is done or the lease is
// lost. The watch starts at the current revision, so etcd delivers the
// deletion as it happens instead of catching up from the past; the read after
// the watch is open closes the gap between the two.
func (e *Etcd) waitDelete(ctx context.Context, kv *mvccpb.KeyValue) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.lease.Context(), cancel)
	defer stop()
	key := string(kv.Key)
	wch := e.cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	if err := watchCreated(wctx, wch); err != nil {
		return e.waitCause(ctx, err)
	}
	g, err := e.cli.Get(wctx, key, clientv3.WithKeysOnly())
	if err != nil {
		return e.waitCause(ctx, err)
	}
	if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != kv.CreateRevision {
		return nil
	}
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return e.waitCause(ctx, err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
	}
	return e.waitCause(ctx, errors.New("watch closed"))
}

func watchCreated(ctx context.Context, wch clientv3.WatchChan) error {
	select {
	case wr, ok := <-wch:
		if !ok {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errors.New("watch closed before it was created")
		}
		return wr.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *Etcd) waitCause(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if lerr := e.lease.Err(); lerr != nil {
		return lerr
	}
	return err
}

// waitError turns the end of a wait into the error Acquire returns: a
// HeldError naming the holder when the caller's context ended it.
func (e *Etcd) waitError(ctx context.Context, name string, err error) error {
	if ctx.Err() == nil {
		return fmt.Errorf("lock: acquire %q: %w", name, err)
	}
	herr := &HeldError{Name: name, Err: ctx.Err()}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if st, serr := e.Status(sctx, name); serr == nil && st.Held {
		herr.Holder, herr.Token = st.Holder, st.Token
	}
	return herr
}

// abandon deletes a contender key that will not be used, and gives its slot
// back once the key is surely gone. The deletion runs even when ctx is done,
// bounded by its own timeout. If it fails, a goroutine keeps trying until it
// succeeds, the lease ends (taking the key with it) or the locker is closed:
// a stray key would otherwise hold or block the lock for as long as this
// process keeps the lease alive.
func (e *Etcd) abandon(ctx context.Context, key string, done func(reusable bool)) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	_, err := e.cli.Delete(dctx, key)
	cancel()
	if err == nil {
		done(true)
		return
	}
	e.logger.Warn("lock: could not delete an abandoned contender key; retrying in the background", "key", key, "err", err)
	e.cleaners.Add(1)
	go func() {
		defer e.cleaners.Done()
		backoff := 100 * time.Millisecond
		for {
			select {
			case <-e.stop:
				return
			case <-e.lease.Done():
				return
			case <-time.After(backoff):
			}
			dctx, cancel := context.WithTimeout(e.lease.Context(), cleanupTimeout)
			_, err := e.cli.Delete(dctx, key)
			cancel()
			if err == nil {
				done(true)
				return
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}()
}

// Release releases name if this locker holds it with token. It reads the
// holder, checks the key is one of this locker's, and deletes it in a
// transaction that compares the create revision, so a late or repeated
// release can never delete a later holder's key, and no other locker can
// release it, even knowing the token.
func (e *Etcd) Release(ctx context.Context, name string, token int64) error {
	if err := CheckName(name); err != nil {
		return err
	}
	prefix := e.keys.LockContender(name, e.nonce)
	// The holder's key must be one of this locker's: its name carries the
	// locker's lease and nonce, and a key's name never changes.
	return e.releaseMatching(ctx, name, token, func(kv *mvccpb.KeyValue) bool {
		return strings.HasPrefix(string(kv.Key), prefix)
	})
}

// ReleaseIf releases name if it is held with token and match accepts the
// holder: the lease its key is bound to and its record. It is for servers
// that release on behalf of clients who prove the holding by the token and
// their session or owner name (the HTTP API builds a locker per request, so
// Release's check of the locker itself cannot serve them). A refusal is a
// *NotHeldError, and nothing changes.
func (e *Etcd) ReleaseIf(ctx context.Context, name string, token int64, match func(lease clientv3.LeaseID, h Holder) bool) error {
	if err := CheckName(name); err != nil {
		return err
	}
	return e.releaseMatching(ctx, name, token, func(kv *mvccpb.KeyValue) bool {
		return match(clientv3.LeaseID(kv.Lease), decodeHolder(kv))
	})
}

// ReleaseContender releases name if the contender key named contender
// (the last part of a holding's Key, as an HTTP client was told it) is the
// holder with token, in one transaction. The caller checks that the key is
// the client's (its name starts with the client's lease); a refusal is a
// *NotHeldError, and nothing changes.
func (e *Etcd) ReleaseContender(ctx context.Context, name, contender string, token int64) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if err := keyspace.CheckName("contender", contender); err != nil {
		return err
	}
	return e.releaseKey(ctx, name, e.keys.LockContender(name, contender), token)
}

// releaseMatching deletes the holder's key of name if its create revision
// is token and match accepts it.
func (e *Etcd) releaseMatching(ctx context.Context, name string, token int64, match func(*mvccpb.KeyValue) bool) error {
	g, err := e.cli.Get(ctx, e.keys.Lock(name), clientv3.WithFirstCreate()...)
	if err != nil {
		return fmt.Errorf("lock: release %q: %w", name, err)
	}
	if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != token || !match(g.Kvs[0]) {
		return e.notHeld(ctx, name, token)
	}
	return e.releaseKey(ctx, name, string(g.Kvs[0].Key), token)
}

// releaseKey deletes key, one of this locker's own contender keys, if it is
// still the contender created at token.
func (e *Etcd) releaseKey(ctx context.Context, name, key string, token int64) error {
	resp, err := e.batch.txn(ctx, e.cli, name,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", token)},
		[]clientv3.Op{clientv3.OpDelete(key)}, nil)
	if err != nil {
		return fmt.Errorf("lock: release %q: %w", name, err)
	}
	if !resp.Succeeded {
		return e.notHeld(ctx, name, token)
	}
	return nil
}

func (e *Etcd) notHeld(ctx context.Context, name string, token int64) error {
	nerr := &NotHeldError{Name: name, Token: token}
	if st, err := e.Status(ctx, name); err == nil {
		nerr.Current = st
	}
	return nerr
}

// Status reads the holder of name, how many wait behind it, and how long its
// lease has left.
func (e *Etcd) Status(ctx context.Context, name string) (Status, error) {
	if err := CheckName(name); err != nil {
		return Status{}, err
	}
	g, err := e.cli.Get(ctx, e.keys.Lock(name), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return Status{}, fmt.Errorf("lock: status %q: %w", name, err)
	}
	return e.status(ctx, name, g.Kvs), nil
}

func (e *Etcd) status(ctx context.Context, name string, kvs []*mvccpb.KeyValue) Status {
	st := Status{Name: name, TTL: -1}
	if len(kvs) == 0 {
		return st
	}
	first := kvs[0]
	for _, kv := range kvs[1:] {
		if kv.CreateRevision < first.CreateRevision {
			first = kv
		}
	}
	st.Held, st.Token, st.Holder, st.Waiters = true, first.CreateRevision, decodeHolder(first), len(kvs)-1
	if first.Lease != 0 {
		if ttl, err := e.cli.TimeToLive(ctx, clientv3.LeaseID(first.Lease)); err == nil && ttl.TTL >= 0 {
			st.TTL = time.Duration(ttl.TTL) * time.Second
		}
	}
	return st
}

// List returns every held lock of the namespace, ordered by name.
func (e *Etcd) List(ctx context.Context) ([]Status, error) {
	g, err := e.cli.Get(ctx, e.keys.Locks(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("lock: list: %w", err)
	}
	byName := map[string][]*mvccpb.KeyValue{}
	for _, kv := range g.Kvs {
		if name, ok := e.keys.LockName(string(kv.Key)); ok {
			byName[name] = append(byName[name], kv)
		}
	}
	out := make([]Status, 0, len(byName))
	for name, kvs := range byName {
		out = append(out, e.status(ctx, name, kvs))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func decodeHolder(kv *mvccpb.KeyValue) Holder {
	var h Holder
	if err := json.Unmarshal(kv.Value, &h); err != nil {
		h.ID = "unknown (unreadable record)"
	}
	return h
}
