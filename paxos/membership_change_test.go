package paxos

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestChangeRetriedIsAppliedOnce: a membership change sent again
// with its ID (a client's retry, a redelivered forward) is a command
// applied twice. The table answers the second with the first result, and
// the configuration must not change again: a late copy of "remove 3"
// after 3 was added back must not remove it a second time, and a retried
// "add" answers its first result, not a rejection.
func TestChangeRetriedIsAppliedOnce(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 4, nil)
	defer c.close()
	founders := c.peers[:3]
	for _, p := range founders {
		c.startWith(p.ID, founders)
	}
	c.leader(5 * time.Second)
	c.startWith(3, founders)

	add := Command{Op: OpAddNode, ID: "add-3", Node: 3, Addr: c.peers[3].Addr}
	rm := Command{Op: OpRemoveNode, ID: "remove-3", Node: 3}
	readd := Command{Op: OpAddNode, ID: "add-3-again", Node: 3, Addr: c.peers[3].Addr}
	first := map[string]Result{}
	for _, cmd := range []Command{add, rm, readd} {
		res := c.mustPropose(0, cmd)
		if res.Code != CodeOK {
			t.Fatalf("%s = %+v", cmd.ID, res)
		}
		first[cmd.ID] = res
	}
	waitStatus(t, c.node(3), 10*time.Second, "a member again", func(s NodeStatus) bool {
		return s.Role == "follower" && len(s.Members) == 4
	})

	// A rejected change: its retry gets the rejection again.
	dup := Command{Op: OpAddNode, ID: "add-3-while-member", Node: 3, Addr: c.peers[3].Addr}
	first[dup.ID] = c.mustPropose(0, dup)
	if first[dup.ID].Code != CodeRejected {
		t.Fatalf("adding a member = %+v, want a rejection", first[dup.ID])
	}

	// The retries, with the same IDs, each followed by a look at every
	// node's configuration.
	for _, cmd := range []Command{rm, add, dup} {
		res := c.mustPropose(1, cmd)
		if !resultsEqual(res, first[cmd.ID]) {
			t.Errorf("retried %s answered %+v, want the first result %+v", cmd.ID, res, first[cmd.ID])
		}
		c.mustPropose(0, Command{Op: OpGet, Lock: "settle"})
		c.converge(5 * time.Second)
		for id, n := range c.running() {
			if got := memberIDs(n.Status()); !slices.Equal(got, []NodeID{0, 1, 2, 3}) {
				t.Errorf("node %d members %v after retrying %s, want [0 1 2 3]", id, got, cmd.ID)
			}
		}
	}
}

// TestRemovedNodeAddedBack: a node that has applied its own removal
// stops voting, but once it is added back it must learn so (from the
// leader's heartbeats and a catch-up) and vote again; else the group
// counts a member that never answers.
func TestRemovedNodeAddedBack(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 4, nil)
	defer c.close()
	founders := c.peers[:3]
	for _, p := range founders {
		c.startWith(p.ID, founders)
	}
	c.leader(5 * time.Second)
	n3 := c.startWith(3, founders)
	if res := c.mustPropose(0, Command{Op: OpAddNode, Node: 3, Addr: c.peers[3].Addr}); res.Code != CodeOK {
		t.Fatalf("add 3 = %+v", res)
	}
	waitStatus(t, n3, 5*time.Second, "a member", func(s NodeStatus) bool { return len(s.Members) == 4 })
	if res := c.mustPropose(0, Command{Op: OpRemoveNode, Node: 3}); res.Code != CodeOK {
		t.Fatalf("remove 3 = %+v", res)
	}
	waitStatus(t, n3, 5*time.Second, "removed", func(s NodeStatus) bool { return s.Role == "removed" })
	if res := c.mustPropose(0, Command{Op: OpAddNode, Node: 3, Addr: c.peers[3].Addr}); res.Code != CodeOK {
		t.Fatalf("add 3 again = %+v", res)
	}
	// A voting member again: a follower, or the leader, when it did not
	// hear the leader before its election timeout (it heard nothing while
	// removed) and won the election it then started, which a voting member
	// may do.
	waitStatus(t, n3, 5*time.Second, "a voting member again", func(s NodeStatus) bool {
		return (s.Role == "follower" || s.Role == "leader") && len(s.Members) == 4
	})
	// It counts: with one of the four down, node 3 is the third vote of
	// every quorum.
	c.stop(0)
	res, err := c.propose(3, Command{Op: OpAcquire, Lock: "after", Owner: "o", TTL: 600000}, 10*time.Second)
	if err != nil || res.Code != CodeOK {
		t.Fatalf("acquire with node 3 as the third vote = %+v, %v", res, err)
	}
}

// TestJoinerStartsFromTheGroupsConfiguration: a node that joins is
// started with the current members, not the group's first ones. Replaying
// the log from slot 1 against them applies every earlier change to the
// wrong configuration: a snapshot it takes on the way records members the
// group did not have at that index (and catch-up hands such snapshots to
// lagging nodes), and the results of those changes differ from the other
// nodes'. Its snapshot must list the members the log gives at its index.
func TestJoinerStartsFromTheGroupsConfiguration(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var joinerSnap atomic.Uint64
	c := newTestCluster(t, 5, func(cfg *Config) {
		if cfg.ID == 4 && joinerSnap.Load() > 0 {
			cfg.SnapshotEvery = joinerSnap.Load()
		}
	})
	defer c.close()
	founders := c.peers[:3]
	for _, p := range founders {
		c.startWith(p.ID, founders)
	}
	c.leader(5 * time.Second)
	for k := range 4 {
		c.mustPropose(0, Command{Op: OpAcquire, Lock: fmt.Sprint("a", k), Owner: "o", TTL: 600000})
	}
	c.startWith(3, founders)
	add3 := c.mustPropose(0, Command{Op: OpAddNode, Node: 3, Addr: c.peers[3].Addr})
	// Replaying from slot 1, the joiner would snapshot just before add 3.
	joinerSnap.Store(add3.Index - 1)
	n4 := c.startWith(4, append(slices.Clone(founders), c.peers[3]))
	add4 := c.mustPropose(0, Command{Op: OpAddNode, Node: 4, Addr: c.peers[4].Addr})
	if add4.Code != CodeOK {
		t.Fatalf("add 4 = %+v", add4)
	}
	waitStatus(t, n4, 5*time.Second, "a member", func(s NodeStatus) bool { return len(s.Members) == 5 })
	c.mustPropose(4, Command{Op: OpGet, Lock: "a0"})
	c.converge(5 * time.Second)
	c.quiesce()
	c.stop(4)
	c.net.Heal()
	if n4.snap == nil {
		t.Fatal("the joiner has no snapshot")
	}
	want := []NodeID{0, 1, 2}
	if n4.snap.Index >= add3.Index {
		want = append(want, 3)
	}
	if n4.snap.Index >= add4.Index {
		want = append(want, 4)
	}
	var got []NodeID
	for _, p := range n4.snap.Members {
		got = append(got, p.ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the joiner's snapshot at %d lists members %v; the log gives %v (3 added at %d, 4 at %d)",
			n4.snap.Index, got, want, add3.Index, add4.Index)
	}
	c.start(4)
	c.converge(5 * time.Second)
	c.stopAndCompare() // the remembered results of the changes agree too
}
