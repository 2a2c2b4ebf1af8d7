package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The parts of TestLeaderFailover besides the queue: lock holders, a
// registry written and watched, and a write probe, all in the test's
// process on clients given every member's endpoint, each running until
// stop is cancelled.

// failoverNS is the namespace of the locks and the registry.
const failoverNS = "failover"

// heldSpan is one lock holding as its holder saw it: from the moment
// AcquireFenced returned to the moment it released (or learned it had
// lost the lock), with its token.
type heldSpan struct {
	holder     int
	token      int64
	from, till time.Time
}

// fencedWrite is a write that etcd accepted under a lock's token.
type fencedWrite struct {
	token, rev int64
}

// lockParts records what the lock holders did.
type lockParts struct {
	mu       sync.Mutex
	holdings []heldSpan
	writes   []fencedWrite
	errs     []string
	// transient counts acquisitions that failed in the failover (see
	// transient): their outcome unknown, the holder tries again.
	transient int
}

// runLockers runs n holders, each with a lease of its own (TTL ttl), that
// take lock "failover" in turn: acquire (waiting), a fenced write of the
// token, a short hold, release; until stop ends.
func runLockers(stop context.Context, cli *clientv3.Client, n int, ttl time.Duration, wg *sync.WaitGroup) *lockParts {
	lp := &lockParts{}
	for id := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			locker, err := lock.NewEtcd(stop, cli, lock.EtcdConfig{Namespace: failoverNS, TTL: ttl, HolderID: fmt.Sprintf("h%d", id)})
			if err != nil {
				lp.fail("holder %d: %v", id, err)
				return
			}
			defer locker.Close(context.Background())
			for stop.Err() == nil {
				lp.holdOnce(stop, locker, id)
			}
		}()
	}
	return lp
}

// holdOnce is one turn of holder id.
func (lp *lockParts) holdOnce(stop context.Context, locker *lock.Etcd, id int) {
	actx, cancel := context.WithTimeout(stop, 10*time.Second)
	l, err := locker.AcquireFenced(actx, "failover")
	cancel()
	if err != nil {
		switch {
		case stop.Err() != nil:
		case transient(err):
			lp.mu.Lock()
			lp.transient++
			lp.mu.Unlock()
		default:
			lp.fail("holder %d: acquire: %v", id, err)
		}
		time.Sleep(50 * time.Millisecond)
		return
	}
	h := heldSpan{holder: id, token: l.Token(), from: time.Now()}
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	resp, err := l.Txn(wctx).Then(clientv3.OpPut(keyspace.MustNew(failoverNS).Root()+"fenced", fmt.Sprint(l.Token()))).Commit()
	cancel()
	if err == nil && resp.Succeeded {
		lp.mu.Lock()
		lp.writes = append(lp.writes, fencedWrite{token: l.Token(), rev: resp.Header.Revision})
		lp.mu.Unlock()
	}
	select {
	case <-time.After(20 * time.Millisecond):
	case <-l.Context().Done():
	}
	h.till = time.Now() // it stops counting itself the holder here, at the latest
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = l.Release(rctx)
	cancel()
	lp.mu.Lock()
	lp.holdings = append(lp.holdings, h)
	lp.mu.Unlock()
}

// fail records an error of a holder.
func (lp *lockParts) fail(format string, args ...any) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	lp.errs = append(lp.errs, fmt.Sprintf(format, args...))
}

// violations returns every pair of holdings of two holders that overlap
// in time, every token not above the one granted before it, and every
// fenced write accepted after a write of a higher token.
func (lp *lockParts) violations() []string {
	var out []string
	hs := slices.Clone(lp.holdings)
	slices.SortFunc(hs, func(a, b heldSpan) int { return a.from.Compare(b.from) })
	for i := 1; i < len(hs); i++ {
		a, b := hs[i-1], hs[i]
		if b.from.Before(a.till) {
			out = append(out, fmt.Sprintf("holder %d (token %d) held from %s while holder %d (token %d) held until %s",
				b.holder, b.token, b.from.Format(time.StampMicro), a.holder, a.token, a.till.Format(time.StampMicro)))
		}
		if b.token <= a.token {
			out = append(out, fmt.Sprintf("token %d granted after token %d", b.token, a.token))
		}
	}
	ws := slices.Clone(lp.writes)
	slices.SortFunc(ws, func(a, b fencedWrite) int { return int(a.rev - b.rev) })
	for i := 1; i < len(ws); i++ {
		if ws[i].token < ws[i-1].token {
			out = append(out, fmt.Sprintf("a fenced write of token %d accepted at revision %d after one of token %d", ws[i].token, ws[i].rev, ws[i-1].token))
		}
	}
	return out
}

// regOp is one change the registrar made, as etcd answered it.
type regOp struct {
	typ registry.EventType
	id  string
	rev int64
}

// registryParts records the registrar's changes and what the watcher saw.
type registryParts struct {
	mu        sync.Mutex
	ops       int
	seen      []regOp
	errs      []string
	transient int // requests that failed in the failover (see transient)
	w         *registry.Watcher
	read      chan struct{} // closed when the watcher's events are all read
}

// close closes the watcher and waits until its events are all read.
func (rp *registryParts) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = rp.w.Close(ctx)
	<-rp.read
}

// runRegistry registers, rewrites and removes endpoints of component
// "model" (five ids in turn) every 10 ms under a lease of its own, and
// follows them with a registry.Watcher; until stop ends.
func runRegistry(stop context.Context, cli *clientv3.Client, ttl time.Duration, wg *sync.WaitGroup) (*registryParts, error) {
	rp := &registryParts{}
	w, err := registry.Watch(stop, cli, failoverNS, "model")
	if err != nil {
		return nil, err
	}
	rp.w, rp.read = w, make(chan struct{})
	wg.Add(1)
	go func() {
		defer close(rp.read) // once the watcher is closed (see close)
		for ev := range w.Events() {
			rp.mu.Lock()
			rp.seen = append(rp.seen, regOp{typ: ev.Type, id: ev.Instance.ID, rev: ev.Revision})
			rp.mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		l, err := lease.Grant(stop, cli, ttl)
		if err != nil {
			rp.fail("registrar: %v", err)
			return
		}
		defer l.Close(context.Background())
		for i := 0; stop.Err() == nil; i++ {
			rp.change(stop, cli, l, i)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return rp, nil
}

// change makes the registrar's change number i: a put of id i%5 with i
// as its data, and every third a delete of id (i+2)%5.
func (rp *registryParts) change(stop context.Context, cli *clientv3.Client, l *lease.Lease, i int) {
	ctx, cancel := context.WithTimeout(stop, 5*time.Second)
	defer cancel()
	ep := registry.Endpoint{ID: fmt.Sprintf("m%d", i%5), Address: "127.0.0.1:9", Data: []byte(fmt.Sprintf(`{"seq":%d}`, i))}
	if _, _, err := registry.PutLeased(ctx, cli, failoverNS, "model", ep, l.ID()); err != nil && stop.Err() == nil {
		rp.failed(err, "registrar: put: %v", err)
	}
	if i%3 == 2 {
		if err := registry.DeleteLeased(ctx, cli, failoverNS, "model", fmt.Sprintf("m%d", (i+2)%5), l.ID()); err != nil && stop.Err() == nil && !errors.Is(err, registry.ErrNotRegistered) {
			rp.failed(err, "registrar: delete: %v", err)
		}
	}
	rp.mu.Lock()
	rp.ops++
	rp.mu.Unlock()
}

// fail records an error of the registrar.
func (rp *registryParts) fail(format string, args ...any) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	rp.errs = append(rp.errs, fmt.Sprintf(format, args...))
}

// failed records err, an error of the registrar: counted apart when the
// failover explains it (see transient).
func (rp *registryParts) failed(err error, format string, args ...any) {
	if transient(err) {
		rp.mu.Lock()
		rp.transient++
		rp.mu.Unlock()
		return
	}
	rp.fail(format, args...)
}

// transient reports whether err is what a request meets while the leader
// fails over: the connection to it broken, a leader change, a timeout. The
// request's outcome is unknown; a client retries or gives up.
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	for _, s := range []string{"Unavailable", "leader changed", "request timed out", "no leader", "connection reset", "EOF"} {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}

// missed compares what the watcher saw, from its snapshot's revision to
// rev, with etcd's own history of the component's endpoints over the same
// revisions (read with a fresh watch): it returns the changes the watcher
// missed or saw that did not happen, and how many changes there were.
func (rp *registryParts) missed(cli *clientv3.Client, rev int64) ([]string, int, error) {
	_, from := rp.w.Snapshot()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := keyspace.MustNew(failoverNS)
	var truth []regOp
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	wch := cli.Watch(wctx, keys.ComponentEndpoints("model"), clientv3.WithPrefix(), clientv3.WithRev(from+1))
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	// The history is read once etcd says the watch has caught up past
	// rev: a progress notification, which it sends only to a watch in
	// sync, asked for every 200 ms.
	for synced := false; !synced; {
		select {
		case <-tick.C:
			_ = cli.RequestProgress(wctx)
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return nil, 0, fmt.Errorf("read the registry's history: %v (channel open %t)", wr.Err(), ok)
			}
			for _, ev := range wr.Events {
				_, id, _ := keys.EndpointOf(string(ev.Kv.Key))
				typ := registry.Put
				if ev.Type == clientv3.EventTypeDelete {
					typ = registry.Delete
				}
				truth = append(truth, regOp{typ: typ, id: id, rev: ev.Kv.ModRevision})
			}
			synced = wr.IsProgressNotify() && wr.Header.Revision >= rev
		}
	}
	truth = slices.DeleteFunc(truth, func(o regOp) bool { return o.rev > rev })
	// The watcher may be a little behind: wait for it to reach rev.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		rp.mu.Lock()
		n := len(rp.seen)
		caught := len(truth) == 0 || (n > 0 && rp.seen[n-1].rev >= truth[len(truth)-1].rev)
		rp.mu.Unlock()
		if caught {
			break
		}
	}
	rp.mu.Lock()
	seen := slices.DeleteFunc(slices.Clone(rp.seen), func(o regOp) bool { return o.rev > rev })
	rp.mu.Unlock()
	var out []string
	for i := 0; i < max(len(truth), len(seen)); i++ {
		switch {
		case i >= len(seen):
			out = append(out, fmt.Sprintf("missed %s %s at revision %d", truth[i].typ, truth[i].id, truth[i].rev))
		case i >= len(truth) || seen[i] != truth[i]:
			out = append(out, fmt.Sprintf("change %d: saw %s %s at revision %d", i, seen[i].typ, seen[i].id, seen[i].rev))
		}
		if len(out) >= 5 {
			break
		}
	}
	return out, len(truth), nil
}

// writeProbe puts a key every 10 ms (each attempt bounded to 300 ms) and
// records when each attempt began and whether it succeeded, until stop
// ends.
type writeProbe struct {
	mu    sync.Mutex
	tries []probeTry
}

// probeTry is one attempt of the probe.
type probeTry struct {
	began, ended time.Time
	ok           bool
}

// runProbe starts the probe.
func runProbe(stop context.Context, cli *clientv3.Client, wg *sync.WaitGroup) *writeProbe {
	p := &writeProbe{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		key := keyspace.MustNew(failoverNS).Root() + "probe"
		for i := 0; stop.Err() == nil; i++ {
			began := time.Now()
			ctx, cancel := context.WithTimeout(stop, 300*time.Millisecond)
			_, err := cli.Put(ctx, key, fmt.Sprint(i))
			cancel()
			p.mu.Lock()
			p.tries = append(p.tries, probeTry{began: began, ended: time.Now(), ok: err == nil})
			p.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return p
}

// firstWriteAfter is how long after at the first write that began after
// at succeeded; false when none did.
func (p *writeProbe) firstWriteAfter(at time.Time) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, tr := range p.tries {
		if tr.ok && tr.began.After(at) {
			return tr.ended.Sub(at), true
		}
	}
	return 0, false
}
