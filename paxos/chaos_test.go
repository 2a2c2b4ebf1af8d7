package paxos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Adversarial schedules for the consensus core: hard crashes (the disk
// stops taking writes at an arbitrary point of the loop, so what a
// graceful Stop would still persist, the commit index included, is
// lost), a leader isolated in the middle of its batches, two of three
// nodes crashed one after the other, heavy message loss, and a snapshot
// every few entries. Each run is checked by porcupine and by comparing
// the nodes' logs and tables at the end.

// crash stops node id as a power cut would: its storage is closed under
// the running loop first, so nothing after this instant is persisted
// (the loop halts at its next write), then the node and its endpoint go.
func (c *testCluster) crash(id NodeID) {
	c.t.Helper()
	c.mu.Lock()
	n := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	if n == nil {
		return
	}
	_ = n.store.Close()
	_ = n.Stop() // reports the failed write or the closed storage: expected
	_ = n.cfg.Transport.Close()
}

// currentLeader returns the id of a running node that reports itself
// leader, if any.
func (c *testCluster) currentLeader() (NodeID, bool) {
	for id, n := range c.running() {
		if n.Status().Role == "leader" {
			return id, true
		}
	}
	return 0, false
}

// chaosOps is the op count of a chaos run: def, or DROVER_PAXOS_OPS.
func chaosOps(t *testing.T, def int) int {
	if s := os.Getenv("DROVER_PAXOS_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("DROVER_PAXOS_OPS=%q: want a positive number", s)
		}
		return n
	}
	return def
}

// chaosStep is one fault of a schedule, run once the workload has
// completed at fraction of its operations.
type chaosStep struct {
	at   float64
	what string
	do   func(c *testCluster)
}

// runChaos drives a workload over c while steps run, then checks the
// history and that the nodes agree.
func runChaos(t *testing.T, c *testCluster, ops int, steps []chaosStep) {
	t.Helper()
	w := &workload{clients: 12, locks: 8, ops: ops, hist: newHistory()}
	ids := make([]NodeID, 0, len(c.peers))
	for _, p := range c.peers {
		ids = append(ids, p.ID)
	}
	w.call = func(ctx context.Context, client int, cmd Command) (Result, error) {
		n := c.node(ids[(client+int(w.retries.Load()))%len(ids)])
		if n == nil {
			return Result{}, errors.New("node down")
		}
		return n.Propose(ctx, cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, s := range steps {
			for w.done.Load() < int64(s.at*float64(ops)) && ctx.Err() == nil {
				time.Sleep(2 * time.Millisecond)
			}
			if ctx.Err() != nil {
				return
			}
			t.Logf("at %d ops: %s", w.done.Load(), s.what)
			s.do(c)
		}
	})
	start := time.Now()
	w.run(ctx, t)
	cancel()
	wg.Wait()
	t.Logf("%d operations in %s, %d retried; network %+v", w.done.Load(),
		time.Since(start).Round(time.Millisecond), w.retries.Load(), c.net.Stats())
	w.hist.check(t, ops)
}

// healAndCompare restarts every stopped member, lifts the faults and
// checks that the nodes agree.
func healAndCompare(c *testCluster) {
	c.net.Heal()
	c.net.SetDropRate(0)
	c.net.SetDuplicateRate(0)
	for _, p := range c.peers {
		if c.node(p.ID) == nil {
			c.start(p.ID)
		}
	}
	c.leader(10 * time.Second)
	c.mustPropose(c.peers[0].ID, Command{Op: OpGet, Lock: "settle"})
	c.converge(20 * time.Second)
	c.stopAndCompare()
}

// TestChaosCrashesAndIsolation: 30 % loss, 10 % duplicates, a
// snapshot every 7 entries, small batches; the leader isolated twice in
// the middle of its batches, hard crashes of two of three nodes one after
// the other (the second while the first catches up), and of the leader.
func TestChaosCrashesAndIsolation(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.SnapshotEvery = 7; cfg.MaxBatch = 8 },
		MemSeed(60), MemDropRate(0.30), MemDuplicateRate(0.10), MemDelay(0, 3*time.Millisecond))
	defer c.close()
	c.startAll()
	c.leader(10 * time.Second)
	isolateLeader := func(d time.Duration) func(*testCluster) {
		return func(c *testCluster) {
			if id, ok := c.currentLeader(); ok {
				c.net.Isolate(id)
				time.Sleep(d)
				c.net.Heal()
			}
		}
	}
	crashInTurn := func(ids ...NodeID) func(*testCluster) {
		return func(c *testCluster) {
			for _, id := range ids {
				c.crash(id)
				time.Sleep(150 * time.Millisecond)
				c.start(id)
			}
		}
	}
	crashLeader := crashRestart(c.currentLeader)
	crashTwoAtOnce := func(c *testCluster) {
		lead, _ := c.currentLeader()
		a, b := (lead+1)%3, (lead+2)%3
		if lead == 0 { // crash the leader and one follower, or two followers
			a = 0
		}
		c.crash(a)
		c.crash(b)
		time.Sleep(200 * time.Millisecond)
		c.start(a)
		c.start(b)
	}
	runChaos(t, c, chaosOps(t, 1500), []chaosStep{
		{0.10, "isolate the leader", isolateLeader(400 * time.Millisecond)},
		{0.25, "crash 0 then 1", crashInTurn(0, 1)},
		{0.40, "crash the leader", crashLeader},
		{0.55, "isolate the leader", isolateLeader(300 * time.Millisecond)},
		{0.70, "crash 2 then 0", crashInTurn(2, 0)},
		{0.85, "crash the leader", crashLeader},
		{0.92, "crash two at once", crashTwoAtOnce},
	})
	healAndCompare(c)
}

// changer makes membership changes for a chaos run, at whichever member
// answers, and keeps the members the test has changed them to.
type changer struct {
	t       *testing.T
	c       *testCluster
	members sync.Map // NodeID -> Peer
}

func (ch *changer) current() []Peer {
	var ps []Peer
	ch.members.Range(func(_, v any) bool { ps = append(ps, v.(Peer)); return true })
	return ps
}

// change proposes cmd at the members in turn until one answers.
func (ch *changer) change(cmd Command) {
	for range 40 {
		for _, p := range ch.current() {
			n := ch.c.node(p.ID)
			if n == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			res, err := n.Propose(ctx, cmd)
			cancel()
			if err == nil {
				ch.t.Logf("%s %d: %s %s", cmd.Op, cmd.Node, res.Code, res.Err)
				return
			}
		}
	}
	ch.t.Errorf("%s %d never answered", cmd.Op, cmd.Node)
}

// add starts node id knowing the current members and adds it.
func (ch *changer) add(id NodeID) func(*testCluster) {
	return func(c *testCluster) {
		c.startWith(id, ch.current())
		ch.change(Command{Op: OpAddNode, ID: fmt.Sprint("add-", id), Node: id, Addr: c.peers[id].Addr})
		ch.members.Store(id, c.peers[id])
	}
}

// remove removes node id.
func (ch *changer) remove(id NodeID) func(*testCluster) {
	return func(*testCluster) {
		ch.change(Command{Op: OpRemoveNode, ID: fmt.Sprint("remove-", id), Node: id})
		ch.members.Delete(id)
	}
}

// crashRestart hard-crashes the node pick names, and restarts it.
func crashRestart(pick func() (NodeID, bool)) func(*testCluster) {
	return func(c *testCluster) {
		if id, ok := pick(); ok {
			c.crash(id)
			time.Sleep(200 * time.Millisecond)
			c.start(id)
		}
	}
}

// TestChaosMembershipAndCrashes: 3 -> 5 -> 3 under load with 15 %
// loss, duplicates, a snapshot every 5 entries, and hard crashes between
// and around the changes (the leader's among them).
func TestChaosMembershipAndCrashes(t *testing.T) {
	c := newTestCluster(t, 5, func(cfg *Config) { cfg.SnapshotEvery = 5; cfg.MaxBatch = 8 },
		MemSeed(23), MemDropRate(0.15), MemDuplicateRate(0.10), MemDelay(0, 3*time.Millisecond))
	defer c.close()
	founders := c.peers[:3]
	ch := &changer{t: t, c: c}
	for _, p := range founders {
		c.startWith(p.ID, founders)
		ch.members.Store(p.ID, p)
	}
	c.leader(10 * time.Second)
	fixed := func(id NodeID) func() (NodeID, bool) { return func() (NodeID, bool) { return id, true } }
	runChaos(t, c, chaosOps(t, 1200), []chaosStep{
		{0.05, "add 3", ch.add(3)},
		{0.15, "crash 1", crashRestart(fixed(1))},
		{0.25, "add 4", ch.add(4)},
		{0.35, "crash the leader", crashRestart(c.currentLeader)},
		{0.45, "remove 0", ch.remove(0)},
		{0.55, "crash 3", crashRestart(fixed(3))},
		{0.65, "remove 3", ch.remove(3)},
		{0.75, "crash the leader", crashRestart(c.currentLeader)},
	})
	for _, id := range []NodeID{0, 3} {
		c.stop(id) // removed: they take no part in the comparison
	}
	c.net.Heal()
	c.net.SetDropRate(0)
	c.net.SetDuplicateRate(0)
	c.leader(10 * time.Second)
	c.mustPropose(1, Command{Op: OpGet, Lock: "settle"})
	c.converge(20 * time.Second)
	for id, n := range c.running() {
		if got := memberIDs(n.Status()); !slices.Equal(got, []NodeID{1, 2, 4}) {
			t.Errorf("node %d members %v, want [1 2 4]", id, got)
		}
	}
	c.stopAndCompare()
}
