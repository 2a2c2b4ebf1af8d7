package paxos

import (
	"fmt"
	"testing"
	"time"
)

// TestFollowerStallIsNoElection holds a follower's loop up three times,
// each for three election timeouts, the way a descheduled process or a
// round stuck on storage (a campaign's promise, a snapshot's install)
// does: the loop takes a status request and cannot hand the answer over
// until the test reads it. Meanwhile the leader,
// with the other follower, keeps choosing commands. Each time the
// follower's loop runs again its election timer has long passed and the
// leader's messages wait in its inbox: it must restart the timer (its own
// loop was held up) rather than campaign; the leader keeps its ballot and
// the follower catches up.
func TestFollowerStallIsNoElection(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	defer c.close()
	c.startAll()
	leader := c.leader(5 * time.Second)
	ballot := leader.Status().Ballot
	f := c.node((leader.cfg.ID + 1) % 3)
	timeout := f.cfg.ElectionTimeout
	for hold := 0; hold < 3; hold++ {
		held := make(chan NodeStatus)
		f.statusc <- held // the loop now waits to hand its status over
		for end := time.Now().Add(3 * timeout); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			c.mustPropose(leader.cfg.ID, Command{Op: OpAcquire, Lock: fmt.Sprintf("l%d", hold), Owner: "o", TTL: 60000})
		}
		<-held
		time.Sleep(3 * timeout)
	}
	c.converge(5 * time.Second)
	st, ls := f.Status(), leader.Status()
	t.Logf("follower: %d timer restarts, %d loop stalls, longest round %.0f ms, %d elections",
		st.TimerRestarts, st.LoopStalls, st.LongestRoundMS, st.ElectionsStarted)
	if st.ElectionsStarted != 0 || ls.Role != "leader" || ls.Ballot != ballot {
		t.Fatalf("the stalled follower started %d elections; the leader is %s with ballot %v (was %v)", st.ElectionsStarted, ls.Role, ls.Ballot, ballot)
	}
	if st.TimerRestarts == 0 || st.LoopStalls == 0 {
		t.Fatalf("the follower's loop was held up 3 times; it measured %d stalls and restarted its timer %d times", st.LoopStalls, st.TimerRestarts)
	}
}

// TestSnapshotsStaggered: the members of a group apply the same log but
// do not snapshot at the same slot: node i's first snapshot comes a third
// of SnapshotEvery later per step of its id, and the offset stays.
func TestSnapshotsStaggered(t *testing.T) {
	const every = 300
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.SnapshotEvery = every })
	defer c.close()
	c.startAll()
	leader := c.leader(5 * time.Second)
	for i := 0; i < 4*every; i++ {
		c.mustPropose(leader.cfg.ID, Command{Op: OpAcquire, Lock: fmt.Sprint("s", i%16), Owner: fmt.Sprint("o", i), TTL: 60000})
	}
	c.converge(5 * time.Second)
	idx := map[uint64]NodeID{}
	for id := NodeID(0); id < 3; id++ {
		s := c.node(id).Status()
		if s.SnapshotIndex == 0 {
			t.Fatalf("node %d has no snapshot after %d commands", id, 4*every)
		}
		// The first at every*(1+id/3), then every entries apart: the
		// index is that offset modulo every (a few entries late at most).
		off := (s.SnapshotIndex - every*uint64(id)/3) % every
		if off > 20 {
			t.Fatalf("node %d's snapshot is at %d: not every*(1+%d/3) plus a multiple of %d", id, s.SnapshotIndex, id, every)
		}
		if other, ok := idx[s.SnapshotIndex]; ok {
			t.Fatalf("nodes %d and %d snapshot at the same slot %d", other, id, s.SnapshotIndex)
		}
		idx[s.SnapshotIndex] = id
		t.Logf("node %d: snapshot at %d", id, s.SnapshotIndex)
	}
}

// TestElectionWithATimeoutNearTheHeartbeat: an election timeout under two
// heartbeats (which Validate allows) still elects a leader: ticks a
// heartbeat apart are not stalls of the node's own loop.
func TestElectionWithATimeoutNearTheHeartbeat(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.Heartbeat, cfg.ElectionTimeout = 20*time.Millisecond, 30*time.Millisecond })
	defer c.close()
	c.startAll()
	c.leader(5 * time.Second)
}

// TestSteppedDownLeaderNoStall: a leader that steps down (another node
// campaigns) has ticked all along: its first ticks as a follower count no
// stall of its loop and restart no timer.
func TestSteppedDownLeaderNoStall(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	defer c.close()
	c.startAll()
	old := c.leader(5 * time.Second)
	time.Sleep(10 * old.cfg.ElectionTimeout) // leading for a while
	other := c.node((old.cfg.ID + 1) % 3)
	other.campaignNow()
	for end := time.Now().Add(5 * time.Second); old.Status().Role == "leader"; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the old leader did not step down within 5 s of another node's campaign")
		}
	}
	time.Sleep(3 * old.cfg.ElectionTimeout)
	if s := old.Status(); s.TimerRestarts != 0 {
		t.Fatalf("the stepped-down leader restarted its timer %d times for a stall of its own loop", s.TimerRestarts)
	}
}
