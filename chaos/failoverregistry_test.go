package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The registry part of TestLeaderFailover: a registrar that changes the
// endpoints of one component every 10 ms under a lease of its own, and
// registry.Watchers that follow them, all in the test's process on
// clients of their own that know every member's endpoint.
//
// The registrar's round i puts endpoint m(i%5) with data {"seq":i}, and
// every third round deletes m((i+2)%5); when stopped it revokes its lease,
// which deletes every endpoint left at one revision. The sequence number of
// a put is its round; that of a delete is the deleted instance's.
//
// "The watcher missed no event" means, for each watcher:
//
//  1. Its events from its snapshot's revision to the end are etcd's history
//     of the component's endpoints over the same revisions (read afterwards
//     by a fresh watch with previous values), change for change: type, id,
//     sequence number and revision, in order. Nothing missed, added,
//     repeated or reordered.
//  2. That history is the registrar's requests in the order it made them
//     (etcd applies one client's sequential requests in that order): every
//     request etcd acknowledged is in it, a put at the revision etcd
//     answered; a request that failed in the failover (outcome unknown) is
//     in it or not; a delete refused as not registered is not; nothing else
//     is (no lease expired under the registrar). So every acknowledged
//     sequence number reached the watcher as an event of its own. None may
//     be superseded: merging changes (one put for two, a delete stamped
//     with a later revision) is what a re-list does, and the watcher must
//     not re-list across a leader failover, its watch resumes.
//  3. Its view (snapshot and events applied) equals what the store held at
//     the revision of a read right after the registrar's last change, and
//     after the revoke.

// regComponent is the component the registrar changes.
const regComponent = "model"

// regChange is one change of the endpoints: a put of id with sequence
// number seq, or a delete of id (seq: the deleted instance's), at rev.
type regChange struct {
	typ registry.EventType
	id  string
	seq int
	rev int64
}

func (c regChange) String() string {
	return fmt.Sprintf("%s %s seq %d at revision %d", c.typ, c.id, c.seq, c.rev)
}

// regOutcome is what the registrar knows of one of its requests.
type regOutcome int

const (
	regApplied regOutcome = iota // etcd acknowledged it
	regNoop                      // etcd refused it: nothing written
	regUnknown                   // it failed in the failover: applied or not
)

// regRequest is one request of the registrar: a put (seq its round, rev
// the revision etcd answered), a delete of id (seq its round), or the
// revoke of its lease.
type regRequest struct {
	regChange
	revoke       bool
	outcome      regOutcome
	err          string // the error of a request whose outcome is unknown
	began, ended time.Time
}

// matches reports how many changes at the head of h the request made (a
// revoke makes every delete of one revision), and false when it made none.
func (q regRequest) matches(h []regChange) (int, bool) {
	if q.revoke {
		n := 0
		for n < len(h) && h[n].typ == registry.Delete && h[n].rev == h[0].rev {
			n++
		}
		return n, n > 0 || len(h) == 0 // nothing left to delete: nothing in the history
	}
	if len(h) == 0 || h[0].typ != q.typ || h[0].id != q.id {
		return 0, false
	}
	if q.typ == registry.Put && (h[0].seq != q.seq || (q.outcome == regApplied && h[0].rev != q.rev)) {
		return 0, false
	}
	return 1, true
}

// regWatcher is one registry.Watcher and the changes it delivered.
type regWatcher struct {
	name   string  // "on-leader" or "on-follower": where its stream began
	member *member // that member
	widen  func()  // gives its client every endpoint
	w      *registry.Watcher
	read   chan struct{} // closed once its events are all read
	mu     sync.Mutex
	seen   []regChange
}

// registryParts is the registrar, its requests, and the watchers.
type registryParts struct {
	set      *etcdSet
	cli      *clientv3.Client // the registrar's
	watchers []*regWatcher
	mu       sync.Mutex
	reqs     []regRequest
	errs     []string
	// end and endView: the revision and the endpoints of the read right
	// after the registrar's last change, before its revoke.
	end     int64
	endView map[string]regChange
}

// seqOf reads the sequence number of an endpoint's data; -1 when none.
func seqOf(data []byte) int {
	var d struct{ Seq *int }
	if json.Unmarshal(data, &d) != nil || d.Seq == nil {
		return -1
	}
	return *d.Seq
}

// watchRegistry starts a watcher named name on cli and reads its events.
func watchRegistry(ctx context.Context, name string, cli *clientv3.Client) (*regWatcher, error) {
	w, err := registry.Watch(ctx, cli, failoverNS, regComponent)
	if err != nil {
		return nil, err
	}
	rw := &regWatcher{name: name, w: w, read: make(chan struct{})}
	go func() {
		defer close(rw.read) // once the watcher is closed (see close)
		for ev := range w.Events() {
			rw.mu.Lock()
			rw.seen = append(rw.seen, regChange{typ: ev.Type, id: ev.Instance.ID, seq: seqOf(ev.Instance.Data), rev: ev.Revision})
			rw.mu.Unlock()
		}
	}()
	return rw, nil
}

// close closes the watcher and waits until its events are all read.
func (rw *regWatcher) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = rw.w.Close(ctx)
	<-rw.read
}

// delivered returns the changes the watcher delivered up to revision rev.
func (rw *regWatcher) delivered(rev int64) []regChange {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(rw.seen), func(c regChange) bool { return c.rev > rev })
}

// close closes every watcher.
func (rp *registryParts) close() {
	for _, rw := range rp.watchers {
		rw.close()
	}
}

// runRegistrar runs the registrar on rp.cli until stop ends, then reads
// the endpoints and revokes its lease.
func (rp *registryParts) runRegistrar(stop context.Context, ttl time.Duration, wg *sync.WaitGroup) {
	wg.Go(func() {
		gctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := lease.Grant(gctx, rp.cli, ttl)
		cancel()
		if err != nil {
			rp.fail("registrar: %v", err)
			return
		}
		for i := 0; stop.Err() == nil; i++ {
			rp.change(l, i)
			time.Sleep(10 * time.Millisecond)
		}
		rp.readEnd()
		if err := l.Err(); err != nil {
			rp.fail("registrar: its lease was lost: %v", err)
		}
		rp.do(regRequest{revoke: true}, func(ctx context.Context) (int64, error) { return 0, l.Close(ctx) })
	})
}

// change makes the registrar's round i.
func (rp *registryParts) change(l *lease.Lease, i int) {
	ep := registry.Endpoint{ID: fmt.Sprintf("m%d", i%5), Address: "127.0.0.1:9", Data: []byte(fmt.Sprintf(`{"seq":%d}`, i))}
	rp.do(regRequest{regChange: regChange{typ: registry.Put, id: ep.ID, seq: i}}, func(ctx context.Context) (int64, error) {
		in, _, err := registry.PutLeased(ctx, rp.cli, failoverNS, regComponent, ep, l.ID())
		return in.ModRevision, err
	})
	if i%3 == 2 {
		id := fmt.Sprintf("m%d", (i+2)%5)
		rp.do(regRequest{regChange: regChange{typ: registry.Delete, id: id, seq: i}}, func(ctx context.Context) (int64, error) {
			return 0, registry.DeleteLeased(ctx, rp.cli, failoverNS, regComponent, id, l.ID())
		})
	}
}

// do makes request q with f, bounded to 5 s, and records it with its
// outcome; f returns the revision of a put.
func (rp *registryParts) do(q regRequest, f func(context.Context) (int64, error)) {
	q.began = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	rev, err := f(ctx)
	cancel()
	q.ended = time.Now()
	switch {
	case err == nil:
		q.outcome, q.rev = regApplied, rev
	case errors.Is(err, registry.ErrNotRegistered):
		q.outcome = regNoop
	default:
		q.outcome, q.err = regUnknown, err.Error()
		if !transient(err) {
			rp.fail("registrar: %s: %v", q.regChange, err)
		}
	}
	rp.mu.Lock()
	rp.reqs = append(rp.reqs, q)
	rp.mu.Unlock()
}

// readEnd reads the endpoints right after the registrar's last change
// (trying up to 10 times).
func (rp *registryParts) readEnd() {
	var err error
	for range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		var g *clientv3.GetResponse
		g, err = rp.cli.Get(ctx, keyspace.MustNew(failoverNS).ComponentEndpoints(regComponent), clientv3.WithPrefix())
		cancel()
		if err == nil {
			rp.mu.Lock()
			rp.end, rp.endView = g.Header.Revision, viewOf(g)
			rp.mu.Unlock()
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	rp.fail("registrar: read the endpoints at the end: %v", err)
}

// viewOf is the endpoints a read returned, by id.
func viewOf(g *clientv3.GetResponse) map[string]regChange {
	out := map[string]regChange{}
	for _, kv := range g.Kvs {
		if in, ok := registry.Decode(keyspace.MustNew(failoverNS), kv); ok {
			out[in.ID] = regChange{typ: registry.Put, id: in.ID, seq: seqOf(in.Data), rev: in.ModRevision}
		}
	}
	return out
}

// firstAckAfter is how long after at the first request that began after
// at was acknowledged; false when none was.
func (rp *registryParts) firstAckAfter(at time.Time) (time.Duration, bool) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	for _, q := range rp.reqs {
		if q.began.After(at) && q.outcome == regApplied {
			return q.ended.Sub(at), true
		}
	}
	return 0, false
}

// unknown describes the requests whose outcome is unknown, their times
// from at.
func (rp *registryParts) unknown(at time.Time) []string {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	var out []string
	for _, q := range rp.reqs {
		if q.outcome == regUnknown {
			out = append(out, fmt.Sprintf("%s %s seq %d: sent %s after the kill, failed %s after it: %s",
				q.typ, q.id, q.seq, round(q.began.Sub(at)), round(q.ended.Sub(at)), q.err))
		}
	}
	return out
}

// fail records an error of the registrar.
func (rp *registryParts) fail(format string, args ...any) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	rp.errs = append(rp.errs, fmt.Sprintf(format, args...))
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

// history reads etcd's history of the endpoints over (from, to] with a
// fresh watch (previous values give a delete's sequence number), once etcd
// says the watch has caught up past to: a progress notification, which it
// sends only to a watch in sync, asked for every 200 ms.
func history(cli *clientv3.Client, from, to int64) ([]regChange, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := keyspace.MustNew(failoverNS)
	wch := cli.Watch(ctx, keys.ComponentEndpoints(regComponent), clientv3.WithPrefix(), clientv3.WithRev(from+1), clientv3.WithPrevKV())
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var out []regChange
	for synced := false; !synced; {
		select {
		case <-tick.C:
			_ = cli.RequestProgress(ctx)
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return nil, fmt.Errorf("read the registry's history: %v (channel open %t)", wr.Err(), ok)
			}
			for _, ev := range wr.Events {
				_, id, _ := keys.EndpointOf(string(ev.Kv.Key))
				c := regChange{typ: registry.Put, id: id, seq: seqOf(endpointData(ev.Kv.Value)), rev: ev.Kv.ModRevision}
				if ev.Type == clientv3.EventTypeDelete {
					c.typ, c.seq = registry.Delete, -1
					if ev.PrevKv != nil {
						c.seq = seqOf(endpointData(ev.PrevKv.Value))
					}
				}
				out = append(out, c)
			}
			synced = wr.IsProgressNotify() && wr.Header.Revision >= to
		}
	}
	return slices.DeleteFunc(out, func(c regChange) bool { return c.rev > to }), nil
}

// endpointData is the data of an endpoint's stored JSON.
func endpointData(v []byte) []byte {
	var ep registry.Endpoint
	_ = json.Unmarshal(v, &ep)
	return ep.Data
}

// viewAt applies changes up to rev to the snapshot: the endpoints by id.
func viewAt(snap []registry.Instance, changes []regChange, rev int64) map[string]regChange {
	out := map[string]regChange{}
	for _, in := range snap {
		out[in.ID] = regChange{typ: registry.Put, id: in.ID, seq: seqOf(in.Data), rev: in.ModRevision}
	}
	for _, c := range changes {
		switch {
		case c.rev > rev:
		case c.typ == registry.Put:
			out[c.id] = c
		default:
			delete(out, c.id)
		}
	}
	return out
}

// describeView lists a view's endpoints, sorted, for messages.
func describeView(v map[string]regChange) string {
	var s []string
	for _, id := range slices.Sorted(maps.Keys(v)) {
		s = append(s, fmt.Sprintf("%s seq %d at %d", id, v[id].seq, v[id].rev))
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// regFindings is what the registry checks found.
type regFindings struct {
	requests map[regOutcome]int // the registrar's requests by outcome
	changes  int                // in etcd's history
	observed int                // acknowledged requests found in it
	events   map[string]int     // events each watcher delivered
	relists  int                // of every watcher
	problems []string
}

// check reads the endpoints and etcd's history after the registrar's
// revoke and makes checks 1 to 3 for every watcher.
func (rp *registryParts) check() (regFindings, error) {
	f := regFindings{requests: map[regOutcome]int{}, events: map[string]int{}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	g, err := rp.cli.Get(ctx, keyspace.MustNew(failoverNS).ComponentEndpoints(regComponent), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return f, err
	}
	fin, finView := g.Header.Revision, viewOf(g)
	from := fin
	for _, rw := range rp.watchers {
		_, rev := rw.w.Snapshot()
		from = min(from, rev)
	}
	truth, err := history(rp.cli, from, fin)
	if err != nil {
		return f, err
	}
	rp.mu.Lock()
	reqs, end, endView := slices.Clone(rp.reqs), rp.end, rp.endView
	rp.mu.Unlock()
	for _, q := range reqs {
		f.requests[q.outcome]++
	}
	f.changes = len(truth)
	f.observed, f.problems = checkRequests(reqs, truth)
	for _, rw := range rp.watchers {
		snap, rev := rw.w.Snapshot()
		own := slices.DeleteFunc(slices.Clone(truth), func(c regChange) bool { return c.rev <= rev })
		seen := rw.caughtUp(own, fin)
		f.events[rw.name] = len(seen)
		f.relists += rw.w.Relists()
		for _, p := range compareChanges(seen, own) {
			f.problems = append(f.problems, fmt.Sprintf("watcher %s: %s", rw.name, p))
		}
		for _, v := range []struct {
			rev   int64
			store map[string]regChange
		}{{end, endView}, {fin, finView}} {
			if mine := viewAt(snap, seen, v.rev); !maps.Equal(mine, v.store) {
				f.problems = append(f.problems, fmt.Sprintf("watcher %s: its view at revision %d is %s, the store's %s", rw.name, v.rev, describeView(mine), describeView(v.store)))
			}
		}
		if n := rw.w.Relists(); n > 0 {
			f.problems = append(f.problems, fmt.Sprintf("watcher %s re-listed %d times: changes were merged, not delivered each", rw.name, n))
		}
	}
	return f, nil
}

// caughtUp waits up to 10 s for the watcher to deliver the last of truth,
// and returns what it delivered up to rev.
func (rw *regWatcher) caughtUp(truth []regChange, rev int64) []regChange {
	for deadline := time.Now().Add(10 * time.Second); len(truth) > 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if s := rw.delivered(rev); len(s) > 0 && s[len(s)-1].rev >= truth[len(truth)-1].rev {
			break
		}
	}
	return rw.delivered(rev)
}

// compareChanges is check 1: seen must be truth, change for change. It
// describes the first 5 differences.
func compareChanges(seen, truth []regChange) []string {
	var out []string
	for i := 0; i < max(len(truth), len(seen)) && len(out) < 5; i++ {
		switch {
		case i >= len(seen):
			out = append(out, fmt.Sprintf("missed %s (change %d of etcd's history)", truth[i], i))
		case i >= len(truth):
			out = append(out, fmt.Sprintf("delivered %s, which etcd's history does not have", seen[i]))
		case seen[i] != truth[i]:
			out = append(out, fmt.Sprintf("change %d: delivered %s, etcd's history has %s", i, seen[i], truth[i]))
		}
	}
	return out
}

// checkRequests is check 2: it walks the registrar's requests in the
// order it made them along etcd's history, and returns how many
// acknowledged requests it found there and what did not fit.
func checkRequests(reqs []regRequest, truth []regChange) (int, []string) {
	observed, j := 0, 0
	var out []string
	for _, q := range reqs {
		if q.outcome == regNoop {
			continue
		}
		n, ok := q.matches(truth[j:])
		switch {
		case ok:
			j += n
			if q.outcome == regApplied {
				observed++
			}
		case q.outcome == regApplied:
			what := q.regChange.String()
			if q.revoke {
				what = "the revoke of its lease"
			}
			out = append(out, fmt.Sprintf("the registrar's acknowledged %s is not in etcd's history where it belongs", what))
		}
		if len(out) >= 5 {
			return observed, out
		}
	}
	for _, c := range truth[j:min(len(truth), j+5)] {
		out = append(out, fmt.Sprintf("etcd's history has %s, which no request of the registrar made there", c))
	}
	return observed, out
}
