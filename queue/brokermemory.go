package queue

import (
	"context"
	"github.com/droverhq/drover/keyspace"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Client remembers the runs its external claims made (Claim), so that
// reporting their successes (Report, Ack) needs no read: where each task
// is (segment and slot), the run that holds it, and which of the run's
// slots have an outcome, are what the claim wrote and what this Client's
// own reports wrote since. The memory is a guess that etcd checks: the
// write is fenced, as every outcome is, by the run's key (its create
// revision is the token) and by the absence of an exit for each slot, and
// besides by no outcome of the run and no exit in its segment written
// after the revision the memory is as of. Anything another process (a
// second server in front of the same etcd, a canceller, a lease that
// ended) did since makes the write fail, and the outcomes are read and
// written again as without the memory. So the memory can be lost at any
// time (a restart, the bound below) at the cost of a read, never of a
// guarantee. Failures are not taken from memory: they move the task to a
// record of its own, which needs the queue's settings.

// claimCacheRuns bounds the runs remembered: past it, the memory starts
// over (runs whose sessions died unreported would otherwise stay).
const claimCacheRuns = 8192

// claimCacheSlots bounds the claimed tasks remembered (each with a copy
// of its task) the same way.
const claimCacheSlots = 65536

// claimCacheBytes bounds the remembered tasks' bytes (their ids, inputs,
// parameters...) the same way: 65,536 tasks of 2 KB inputs would
// otherwise hold 128 MiB.
const claimCacheBytes = 32 << 20

// taskBytes is about what a copy of t holds.
func taskBytes(t *Task) int {
	return 256 + len(t.ID) + len(t.Type) + len(t.InputDataURI) + len(t.OutputDataURI) + len(t.Parameters) + len(t.Result) + len(t.LastError)
}

// claimCache is what a Client remembers of its external claims. The zero
// value is ready.
type claimCache struct {
	// hits counts the outcomes written from memory; stale the writes from
	// memory that etcd refused (they were read and written again).
	hits, stale atomic.Int64
	mu          sync.Mutex
	runs        map[string]*cachedRun // by run key
	slots       map[heldKey]*cachedSlot
	bytes       int // the remembered tasks' taskBytes
}

// heldKey names a claim: its queue, task and token.
type heldKey struct {
	q, id string
	token int64
}

// cachedRun is a run as a Client last knew it.
type cachedRun struct {
	q, seg string
	ref    runRef
	lease  int64
	last   bool // it took one of its segment's last free slots
	// rev: no outcome of the run and no exit of its segment was written
	// after it that this Client did not write (as far as it knows).
	rev  int64
	done map[int]bool // slots with an outcome written
	ids  []heldKey    // its claims, to forget with it
	size int          // its tasks' taskBytes
}

// cachedSlot is one claimed task of a cached run, as the claim returned
// it.
type cachedSlot struct {
	run  *cachedRun
	slot int
	task Task
}

// remember records the runs of claims (those of tasks, the claims' tasks
// that may run) made under lease l of queue q. A run some of whose tasks
// were given up on (their outcomes written already) is not remembered.
func (cc *claimCache) remember(runsPrefix func(seg string) string, q string, claims []*claim, tasks []*Task, l clientv3.LeaseID) {
	runnable := make(map[*Task]bool, len(tasks))
	for _, t := range tasks {
		runnable[t] = true
	}
	byRun := map[*segRun][]*claim{}
	var order []*segRun
	for _, cl := range claims {
		if cl.run == nil {
			continue
		}
		if _, ok := byRun[cl.run]; !ok {
			order = append(order, cl.run)
		}
		byRun[cl.run] = append(byRun[cl.run], cl)
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for _, r := range order {
		cls := byRun[r]
		all := len(cls) == len(r.v.Slots)
		for _, cl := range cls {
			all = all && runnable[cl.task]
		}
		if !all {
			continue
		}
		if cc.runs == nil || len(cc.runs) >= claimCacheRuns || len(cc.slots) >= claimCacheSlots || cc.bytes >= claimCacheBytes {
			cc.runs, cc.slots, cc.bytes = map[string]*cachedRun{}, map[heldKey]*cachedSlot{}, 0
		}
		cr := &cachedRun{q: q, seg: r.seg, lease: int64(l), last: r.last, rev: r.token, done: map[int]bool{},
			ref: runRef{key: r.runKey, rest: keyspace.RunNameOf(runsPrefix(r.seg), r.runKey), token: r.token, v: r.v}}
		for _, cl := range cls {
			k := heldKey{q, cl.task.ID, r.token}
			cr.ids = append(cr.ids, k)
			cc.slots[k] = &cachedSlot{run: cr, slot: cl.slot, task: *cl.task}
			cr.size += taskBytes(cl.task)
		}
		cc.bytes += cr.size
		cc.runs[r.runKey] = cr
	}
}

// lookup returns the remembered claim of h, if any.
func (cc *claimCache) lookup(h Held) (*cachedSlot, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	s, ok := cc.slots[heldKey{h.Queue, h.ID, h.Token}]
	return s, ok
}

// group is a segGroup of the outcomes items of run cr, made from memory
// rather than read: the run as claimed, the slots its outcomes took since.
func (cc *claimCache) group(cr *cachedRun) *segGroup {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	done := make(map[int]bool, len(cr.done))
	for s := range cr.done {
		done[s] = true
	}
	return &segGroup{q: cr.q, seg: cr.seg, slots: map[int]int{}, tok: map[int]int64{}, rev: cr.rev,
		runs: []leasedRun{{cr.ref, cr.lease}}, done: map[int64]map[int]bool{cr.ref.token: done},
		exits: map[int]bool{}, cached: cr, byslot: map[int]Task{}}
}

// wrote records that the outcomes of slots of run cr were written at
// revision rev; final: the run was deleted with them.
func (cc *claimCache) wrote(cr *cachedRun, slots []int, rev int64, final bool) {
	cc.hits.Add(int64(len(slots)))
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if final {
		cc.forgetLocked(cr)
		return
	}
	for _, s := range slots {
		cr.done[s] = true
	}
	cr.rev = max(cr.rev, rev)
}

// forget drops run cr (if not nil) from memory: what etcd holds of it is
// no longer what the memory says.
func (cc *claimCache) forget(cr *cachedRun) {
	if cr == nil {
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.forgetLocked(cr)
}

// forgetLocked is forget with cc.mu held.
func (cc *claimCache) forgetLocked(cr *cachedRun) {
	if cc.runs[cr.ref.key] != cr {
		return
	}
	delete(cc.runs, cr.ref.key)
	cc.bytes -= cr.size
	for _, k := range cr.ids {
		delete(cc.slots, k)
	}
}

// fromMemory takes from todo the successes whose claims this Client
// remembers, grouped by run; it returns the rest of todo and the groups.
// A failure, a sleep, a wait or a deferral of a remembered claim (each moves the task
// out of its segment into a record) is written from a read: the
// run is forgotten, since that write changes it, and the read learns the
// queue's config (a FIFO queue's task goes back to shard 0).
func (b *broker) fromMemory(os []Outcome, todo []int) (rest []int, groups []*segGroup) {
	byRun := map[*cachedRun]*segGroup{}
	for _, i := range todo {
		s, ok := b.claims.lookup(os[i].Held)
		switch {
		case !ok:
			rest = append(rest, i)
			continue
		case os[i].Failed || !os[i].SleepUntil.IsZero() || os[i].Wait != nil || os[i].Defer != nil:
			b.claims.forget(s.run)
			rest = append(rest, i)
			continue
		}
		g := byRun[s.run]
		if g == nil {
			g = b.claims.group(s.run)
			byRun[s.run] = g
			groups = append(groups, g)
		}
		g.items = append(g.items, i)
		g.slots[i], g.tok[i], g.byslot[s.slot] = s.slot, os[i].Token, s.task
	}
	return rest, groups
}

// reportRemembered writes the outcomes of groups, made from memory, and
// returns those to read and write again: of runs whose write etcd refused
// (the memory was stale; the run is forgotten) or that take more than one
// transaction.
func (b *broker) reportRemembered(ctx context.Context, os []Outcome, groups []*segGroup, out []Reported) (again []int) {
	var writes []*runWrite
	for _, g := range groups {
		writes = append(writes, b.runWrites(ctx, g, os, out)...)
	}
	for _, g := range b.writeRuns(ctx, writes, out) {
		again = append(again, g.items...)
	}
	return again
}

// exitsSince is the compare that no task of g's segment left it (was
// cancelled or purged) after the revision g is as of: g, made from
// memory, has not seen the segment's exits.
func (g *segGroup) exitsSince(c *Client) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(c.keys.Exits(g.q, g.seg)).WithPrefix(), "<", g.rev+1)
}
