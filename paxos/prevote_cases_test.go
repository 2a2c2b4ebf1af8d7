package paxos

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// rejoinCluster is a test cluster whose endpoints are rejoinTransports.
type rejoinCluster struct {
	*testCluster
	mu  sync.Mutex
	eps map[NodeID]*rejoinTransport
}

func newRejoinCluster(t *testing.T, size int, timeout time.Duration) *rejoinCluster {
	rc := &rejoinCluster{eps: map[NodeID]*rejoinTransport{}}
	rc.testCluster = newTestCluster(t, size, func(cfg *Config) {
		if timeout > 0 {
			cfg.ElectionTimeout = timeout
		}
		r := newRejoinTransport(cfg.Transport)
		rc.mu.Lock()
		if old := rc.eps[cfg.ID]; old != nil && old.deaf {
			r.deafen(old.deafTo, true) // a restart keeps the deafness set for it
		}
		rc.eps[cfg.ID] = r
		rc.mu.Unlock()
		cfg.Transport = r
	})
	return rc
}

// ep is node id's current endpoint.
func (rc *rejoinCluster) ep(id NodeID) *rejoinTransport {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.eps[id]
}

// elections is the campaigns the given nodes' votes started.
func (rc *rejoinCluster) elections(ids ...NodeID) uint64 {
	var sum uint64
	for _, id := range ids {
		sum += rc.node(id).Status().ElectionsStarted
	}
	return sum
}

// TestCutOffCandidateRejoinsWithoutElection: a node promises itself a
// ballot and campaigns just as it is cut off, so nobody promises it. It
// must not repeat its Prepare for ever: after an election timeout it is a
// follower again, keeping its promise, and asks for a vote (which reaches
// nobody). When it is back, its promise is above the leader's ballot, so
// it answers the leader's heartbeats with a Nack; the leader, which hears
// the other follower, runs phase 1 again above that promise rather than
// step down, and no election is needed.
func TestCutOffCandidateRejoinsWithoutElection(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newRejoinCluster(t, 3, steadyElectionTimeout)
	defer c.close()
	c.startAll()
	lead := c.leader(5 * time.Second)
	c.mustPropose(lead.cfg.ID, Command{Op: OpAcquire, Lock: "before", Owner: "o", TTL: 600000})
	ballot := lead.Status().Ballot
	id := (lead.cfg.ID + 1) % 3
	a, ep := c.node(id), c.ep(id)

	c.net.Isolate(id)
	a.campaignNow()
	s := waitStatus(t, a, 10*time.Second, "campaigning", func(s NodeStatus) bool { return s.Role == "candidate" })
	promise := s.Ballot
	// Its Prepares go out each tick until the timer fires: a few hundred
	// mean it never gave the campaign up.
	for ep.rounds() < 2 {
		if prepares, _ := ep.sent(); prepares > 600 {
			t.Fatalf("the cut-off candidate sent %d Prepares and asked for no vote: %+v", prepares, a.Status())
		}
		time.Sleep(2 * time.Millisecond)
	}
	if s := a.Status(); s.Role != "follower" || s.Ballot != promise {
		t.Fatalf("after its campaign was given up the node is %s at %v, want a follower keeping its promise %v", s.Role, s.Ballot, promise)
	}
	before := c.elections(0, 1, 2)

	c.net.Heal()
	waitStatus(t, a, 10*time.Second, "following a leader above its promise", func(s NodeStatus) bool {
		return s.HasLeader && promise.Less(s.Ballot)
	})
	ls := lead.Status()
	if ls.Role != "leader" || !promise.Less(ls.Ballot) {
		t.Fatalf("the leader is %s at %v (was leader at %v; the rejoined node promised %v)", ls.Role, ls.Ballot, ballot, promise)
	}
	if after := c.elections(0, 1, 2); after != before {
		t.Fatalf("the rejoin cost %d elections", after-before)
	}
	if get := c.mustPropose(id, Command{Op: OpGet, Lock: "before"}); get.Code != CodeOK {
		t.Fatalf("read at the rejoined node = %+v", get)
	}
	c.converge(5 * time.Second)
	c.stopAndCompare()
}

// TestLeaderWithStuckDiskIsReplaced: one follower is down and the
// leader's disk stalls (every write of its acceptor waits), so nothing
// can be chosen: the leader's own acceptance is needed. Its loop goes on
// heartbeating. The follower restarts but does not hear the leader (its
// connection to it comes back last): it cannot accept the leader's
// proposals, and the other follower, which hears the leader, refuses its
// vote. A leader whose own writes are stuck must not refuse it (nor count
// itself among those it hears), so that the two elect a leader that
// commits.
func TestLeaderWithStuckDiskIsReplaced(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newRejoinCluster(t, 3, 0)
	defer c.close()
	c.startAll()
	lead := c.leader(5 * time.Second)
	c.mustPropose(lead.cfg.ID, Command{Op: OpAcquire, Lock: "warm", Owner: "o", TTL: 600000})
	f, g := (lead.cfg.ID+1)%3, (lead.cfg.ID+2)%3
	c.stop(g)
	c.ep(g).deafen(lead.cfg.ID, true)

	lead.store.mu.Lock()
	held := true
	defer func() {
		if held {
			lead.store.mu.Unlock()
		}
	}()
	stuck := make(chan error, 1)
	go func() {
		res, err := c.propose(lead.cfg.ID, Command{Op: OpAcquire, Lock: "stuck", Owner: "o", TTL: 600000}, 60*time.Second)
		if err == nil && res.Code != CodeOK {
			err = context.Canceled
		}
		stuck <- err
	}()
	c.start(g)
	// The leader heartbeats a tick apart while it leads: a few thousand
	// mean it kept the leadership.
	var next *Node
	for next == nil {
		for _, id := range []NodeID{f, g} {
			if s := c.node(id).Status(); s.Role == "leader" {
				next = c.node(id)
			}
		}
		if beats := c.ep(lead.cfg.ID).sentOf(MsgHeartbeat); beats > 3000 {
			t.Fatalf("the leader with a stuck disk sent %d heartbeats and kept leading", beats)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if res := c.mustPropose(next.cfg.ID, Command{Op: OpAcquire, Lock: "after", Owner: "o", TTL: 600000}); res.Code != CodeOK {
		t.Fatalf("acquire at the new leader = %+v", res)
	}
	lead.store.mu.Unlock()
	held = false
	c.ep(g).deafen(lead.cfg.ID, false)
	if err := <-stuck; err != nil {
		t.Fatalf("the command proposed while the disk was stuck: %v", err)
	}
	c.converge(10 * time.Second)
	c.stopAndCompare()
}

// TestStaleConfigurationWinsNoVote: a node cut off while two members were
// added still counts a majority of the three founders. Back (and still
// not hearing the leader), it asks for a vote, and a founder that does
// not hear the leader either grants it; the grant carries a commit past
// the node's, so it must catch up first, and then a majority of five must
// grant: the two added members hear the leader, so it does not campaign.
func TestStaleConfigurationWinsNoVote(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newRejoinCluster(t, 5, steadyElectionTimeout)
	defer c.close()
	founders := c.peers[:3]
	for _, p := range founders {
		c.startWith(p.ID, founders)
	}
	lead := c.leader(5 * time.Second)
	stale, x := (lead.cfg.ID+1)%3, (lead.cfg.ID+2)%3
	c.mustPropose(lead.cfg.ID, Command{Op: OpAcquire, Lock: "before", Owner: "o", TTL: 600000})

	c.net.Isolate(stale)
	for _, p := range c.peers[3:] {
		c.startWith(p.ID, founders)
		if res := c.mustPropose(lead.cfg.ID, Command{Op: OpAddNode, Node: p.ID, Addr: p.Addr}); res.Code != CodeOK {
			t.Fatalf("add node %d = %+v", p.ID, res)
		}
	}
	for _, p := range c.peers[3:] {
		waitStatus(t, c.node(p.ID), 10*time.Second, "a member following the leader", func(s NodeStatus) bool {
			return s.Role == "follower" && len(s.Members) == 5 && s.HasLeader
		})
	}
	ballot := lead.Status().Ballot
	// x stops hearing the leader: once its lease ran out (it asks for
	// votes itself) it grants the stale node's.
	c.ep(x).deafen(lead.cfg.ID, true)
	for c.ep(x).rounds() < 2 {
		if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
			t.Fatalf("the leader changed: %+v", s)
		}
		time.Sleep(2 * time.Millisecond)
	}
	c.ep(stale).deafen(lead.cfg.ID, true)
	c.net.Heal()
	from := c.ep(stale).rounds()
	const rounds = 3
	for guard := time.Now().Add(30 * time.Second); c.ep(stale).rounds() < from+rounds; time.Sleep(2 * time.Millisecond) {
		if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
			t.Fatalf("the node with a stale configuration deposed the leader: %+v; it: %+v", s, c.node(stale).Status())
		}
		if time.Now().After(guard) {
			t.Fatalf("the stale node asked %d rounds in 30 s, want %d", c.ep(stale).rounds()-from, rounds)
		}
	}
	s := c.node(stale).Status()
	if s.ElectionsStarted != 0 || len(s.Members) != 5 {
		t.Fatalf("the stale node started %d campaigns, knows %d members (want 0 and 5)", s.ElectionsStarted, len(s.Members))
	}
	c.ep(x).deafen(lead.cfg.ID, false)
	c.ep(stale).deafen(lead.cfg.ID, false)
	c.mustPropose(stale, Command{Op: OpGet, Lock: "before"})
	c.converge(10 * time.Second)
	if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
		t.Fatalf("the leader changed: %+v", s)
	}
	c.stopAndCompare()
}

// TestRemovedNodeEndsItsVote: a node removed while its vote before a
// campaign runs ends the vote, and a round granted to a removed node
// starts no campaign.
func TestRemovedNodeEndsItsVote(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	defer c.close()
	n, err := NewNode(c.config(0, c.peers))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Stop() }()
	granted := func() *preVote { return &preVote{seq: 1, granted: map[NodeID]bool{0: true, 1: true}} }
	n.everMember, n.pre = true, granted()
	n.becomeRemoved()
	if n.pre != nil {
		t.Fatal("the removed node's vote before a campaign is still under way")
	}
	n.pre = granted()
	if err := n.tryPreVote(time.Now()); err != nil {
		t.Fatal(err)
	}
	if n.health.elections != 0 || n.pre != nil || n.role != roleRemoved {
		t.Fatalf("a removed node's granted round: %d campaigns, round %v, role %s", n.health.elections, n.pre, n.role)
	}
}
