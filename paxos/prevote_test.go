package paxos

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// steadyElectionTimeout is the election timeout (30 heartbeats) of the
// tests that require a leader to keep its ballot: a leader's loop held up
// by a loaded machine for a whole timeout would rightly be replaced.
const steadyElectionTimeout = 300 * time.Millisecond

// rejoinTransport is a node's endpoint that can lose every message one
// sender sends it (a leader's heartbeats not reaching a restarted node
// while its connection comes back, the others' reaching it). It records
// the rounds of the campaign refusals it got (the Seq of each Nack that
// answers one, by sender), the rounds of the vote before a campaign its
// node sent, how many of those PrePrepares carried no ballot, and how
// many messages of each type it sent.
type rejoinTransport struct {
	Transport
	mu       sync.Mutex
	deaf     bool
	deafTo   NodeID
	refusals map[NodeID]map[uint64]bool
	asked    map[uint64]bool
	noBallot int
	sends    map[MsgType]int
	out      chan Message
	once     sync.Once
}

func newRejoinTransport(tr Transport) *rejoinTransport {
	return &rejoinTransport{Transport: tr, refusals: map[NodeID]map[uint64]bool{}, asked: map[uint64]bool{}, sends: map[MsgType]int{}}
}

// Send counts m, records a PrePrepare's round, and sends m.
func (r *rejoinTransport) Send(m Message) error {
	r.mu.Lock()
	r.sends[m.Type]++
	if m.Type == MsgPrePrepare {
		r.asked[m.Seq] = true
		if m.Ballot.IsZero() {
			r.noBallot++
		}
	}
	r.mu.Unlock()
	return r.Transport.Send(m)
}

// sent is how many Prepares, and PrePrepares without a ballot, its node
// sent.
func (r *rejoinTransport) sent() (prepares, noBallot int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sends[MsgPrepare], r.noBallot
}

// sentOf is how many messages of type t its node sent.
func (r *rejoinTransport) sentOf(t MsgType) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sends[t]
}

// rounds is how many rounds of the vote before a campaign its node sent.
func (r *rejoinTransport) rounds() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.asked)
}

// deafen makes the endpoint lose what from sends (on false: deliver it
// again).
func (r *rejoinTransport) deafen(from NodeID, on bool) {
	r.mu.Lock()
	r.deaf, r.deafTo = on, from
	r.mu.Unlock()
}

// refused is how many campaign rounds (distinct Seqs) from refused.
func (r *rejoinTransport) refused(from NodeID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.refusals[from])
}

// Recv relays the inner endpoint's messages but the lost ones; it closes
// when the inner endpoint does, which ends the relay.
func (r *rejoinTransport) Recv() <-chan Message {
	r.once.Do(func() {
		r.out = make(chan Message, 1024)
		go func() {
			defer close(r.out)
			for m := range r.Transport.Recv() {
				r.mu.Lock()
				lost := r.deaf && m.From == r.deafTo
				if !lost && m.Type == MsgNack && m.Seq != 0 {
					if r.refusals[m.From] == nil {
						r.refusals[m.From] = map[uint64]bool{}
					}
					r.refusals[m.From][m.Seq] = true
				}
				r.mu.Unlock()
				if lost {
					continue
				}
				select {
				case r.out <- m:
				default: // full: lost, as on a real network
				}
			}
		}()
	})
	return r.out
}

// TestRestartedLeaderDoesNotDepose: the leader crashes, the other two
// elect a new one, and the old leader restarts on its data dir without
// hearing the new leader (its messages are lost on the way) while it
// hears the other follower. Its election timer fires again and again; the
// other follower, which hears its leader, refuses each time, so the
// healthy leader keeps its ballot. Once the restarted node hears the
// leader it follows it; and when that leader then stops, a new one is
// elected all the same.
func TestRestartedLeaderDoesNotDepose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var mu sync.Mutex
	eps := map[NodeID]*rejoinTransport{}
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.ElectionTimeout = steadyElectionTimeout
		r := newRejoinTransport(cfg.Transport)
		mu.Lock()
		if old := eps[cfg.ID]; old != nil && old.deaf {
			r.deafen(old.deafTo, true) // a restart keeps the deafness set for it
		}
		eps[cfg.ID] = r
		mu.Unlock()
		cfg.Transport = r
	})
	defer c.close()
	c.startAll()
	old := c.leader(5 * time.Second).cfg.ID
	c.mustPropose(old, Command{Op: OpAcquire, Lock: "before", Owner: "o", TTL: 600000})
	c.stop(old)
	lead := c.leader(5 * time.Second)
	c.mustPropose(lead.cfg.ID, Command{Op: OpAcquire, Lock: "after", Owner: "o", TTL: 600000})
	ballot := lead.Status().Ballot
	follower := 3 - old - lead.cfg.ID

	mu.Lock()
	eps[old].deafen(lead.cfg.ID, true)
	mu.Unlock()
	c.start(old)
	mu.Lock()
	ep := eps[old]
	mu.Unlock()
	// Three rounds refused (three timer firings at least), checking the
	// leader between: it must not change.
	const rounds = 3
	for guard := time.Now().Add(30 * time.Second); ep.refused(follower) < rounds; time.Sleep(2 * time.Millisecond) {
		if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
			t.Fatalf("restarted node %d deposed the leader: node %d is now %s at %v (was leader at %v); restarted node: %+v",
				old, lead.cfg.ID, s.Role, s.Ballot, ballot, c.node(old).Status())
		}
		if time.Now().After(guard) {
			t.Fatalf("node %d refused %d campaign rounds of the restarted node in 30 s, want %d", follower, ep.refused(follower), rounds)
		}
	}
	if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
		t.Fatalf("the leader is now %s at %v (was leader at %v)", s.Role, s.Ballot, ballot)
	}
	if s := c.node(old).Status(); s.Role == "leader" || ballot.Less(s.Ballot) || s.ElectionsStarted != 0 {
		t.Fatalf("the restarted node campaigned: %+v", s)
	}

	// It hears the leader again: it follows.
	ep.deafen(lead.cfg.ID, false)
	get := c.mustPropose(old, Command{Op: OpGet, Lock: "after"})
	if get.Code != CodeOK {
		t.Fatalf("read at the restarted node = %+v", get)
	}
	c.converge(5 * time.Second)
	if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
		t.Fatalf("after the rejoin the leader is %s at %v (was leader at %v)", s.Role, s.Ballot, ballot)
	}

	// A leader that is really gone is still replaced.
	c.stop(lead.cfg.ID)
	next := c.leader(5 * time.Second)
	if s := next.Status(); !ballot.Less(s.Ballot) {
		t.Fatalf("new leader %d at %v, not above the stopped leader's %v", next.cfg.ID, s.Ballot, ballot)
	}
	c.mustPropose(next.cfg.ID, Command{Op: OpGet, Lock: "before"})
	c.converge(5 * time.Second)
	c.stopAndCompare()
}

// TestIsolatedFollowerRejoinsQuietly: a follower cut off from the group
// hears no leader, and its timer fires again and again; its rounds of the
// vote before a campaign reach nobody, so it raises no ballot and starts
// no campaign. When the partition heals, the leader's heartbeats still do
// not reach it for a while (its connection to the leader comes back
// last): the other follower, which hears the leader, refuses its rounds,
// and the leader keeps its ballot. Once the heartbeats reach it, it
// follows the leader. Its PrePrepares carry its promise throughout.
func TestIsolatedFollowerRejoinsQuietly(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var mu sync.Mutex
	eps := map[NodeID]*rejoinTransport{}
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.ElectionTimeout = steadyElectionTimeout
		r := newRejoinTransport(cfg.Transport)
		mu.Lock()
		eps[cfg.ID] = r
		mu.Unlock()
		cfg.Transport = r
	})
	defer c.close()
	c.startAll()
	lead := c.leader(5 * time.Second)
	c.mustPropose(lead.cfg.ID, Command{Op: OpAcquire, Lock: "before", Owner: "o", TTL: 600000})
	ballot := lead.Status().Ballot
	id := (lead.cfg.ID + 1) % 3
	f := c.node(id)
	promised := f.Status().Ballot
	mu.Lock()
	ep := eps[id]
	mu.Unlock()

	c.net.Isolate(id)
	const rounds = 3
	for guard := time.Now().Add(30 * time.Second); ep.rounds() < rounds; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(guard) {
			t.Fatalf("the isolated follower asked for %d votes in 30 s, want %d", ep.rounds(), rounds)
		}
	}
	if s := f.Status(); s.Ballot != promised || s.ElectionsStarted != 0 || s.Role != "follower" {
		t.Fatalf("the isolated follower campaigned: %+v (its promise was %v)", s, promised)
	}
	c.mustPropose(lead.cfg.ID, Command{Op: OpAcquire, Lock: "meanwhile", Owner: "o", TTL: 600000})

	ep.deafen(lead.cfg.ID, true)
	c.net.Heal()
	other := 3 - id - lead.cfg.ID
	for guard := time.Now().Add(30 * time.Second); ep.refused(other) < rounds; time.Sleep(2 * time.Millisecond) {
		if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
			t.Fatalf("the healed follower deposed the leader: node %d is now %s at %v (was leader at %v); follower: %+v",
				lead.cfg.ID, s.Role, s.Ballot, ballot, f.Status())
		}
		if time.Now().After(guard) {
			t.Fatalf("node %d refused %d rounds of the healed follower in 30 s, want %d", other, ep.refused(other), rounds)
		}
	}
	if s := f.Status(); s.Ballot != promised || s.ElectionsStarted != 0 {
		t.Fatalf("the healed follower campaigned: %+v (its promise was %v)", s, promised)
	}
	ep.deafen(lead.cfg.ID, false)
	waitStatus(t, f, 10*time.Second, "following the leader", func(s NodeStatus) bool {
		return s.HasLeader && s.Leader == lead.cfg.ID
	})
	get := c.mustPropose(id, Command{Op: OpGet, Lock: "meanwhile"})
	if get.Code != CodeOK {
		t.Fatalf("read at the healed follower = %+v", get)
	}
	c.converge(5 * time.Second)
	if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
		t.Fatalf("after the heal the leader is %s at %v (was leader at %v)", s.Role, s.Ballot, ballot)
	}
	if s := f.Status(); s.ElectionsStarted != 0 {
		t.Fatalf("the healed follower started %d campaigns", s.ElectionsStarted)
	}
	if _, bare := ep.sent(); bare != 0 {
		t.Fatalf("the follower sent %d PrePrepares without its promise", bare)
	}
	c.stopAndCompare()
}

// TestVoteBeforeCampaignRefusedWhileLeaderHeard drives a member by hand:
// while the group hears its leader, its vote before a campaign is refused
// by the leader and by the follower alike, with a Nack that answers the
// round and carries the promise, and nothing changes; a Prepare of a
// campaign begun anyway is still promised (stickiness holds back only the
// timer's campaigns).
func TestVoteBeforeCampaignRefusedWhileLeaderHeard(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.ElectionTimeout = steadyElectionTimeout })
	defer c.close()
	c.start(0)
	c.start(1)
	lead := c.leader(5 * time.Second)
	c.mustPropose(lead.cfg.ID, Command{Op: OpAcquire, Lock: "a", Owner: "o", TTL: 600000})
	ballot := lead.Status().Ballot
	follower := 1 - lead.cfg.ID
	fake := c.net.Transport(2) // node 2's endpoint, driven by hand: a member
	answer := func(to NodeID, m Message) Message {
		t.Helper()
		m.Group, m.To = "test", to
		if err := fake.Send(m); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(10 * time.Second)
		for {
			select {
			case r := <-fake.Recv():
				if r.From == to && r.Type != MsgHeartbeat && r.Type != MsgAccept {
					return r
				}
			case <-deadline:
				t.Fatalf("node %d did not answer %s", to, m.Type)
			}
		}
	}
	for seq, to := range []NodeID{follower, lead.cfg.ID} {
		r := answer(to, Message{Type: MsgPrePrepare, Slot: 1, Seq: uint64(seq + 1)})
		if r.Type != MsgNack || r.Seq != uint64(seq+1) || r.Ballot != ballot {
			t.Fatalf("node %d answered a vote before a campaign with %s seq %d ballot %v, want a Nack of round %d at %v",
				to, r.Type, r.Seq, r.Ballot, seq+1, ballot)
		}
	}
	if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
		t.Fatalf("the refused vote disturbed the leader: %+v", s)
	}
	if s := c.node(follower).Status(); s.Ballot != ballot || s.Leader != lead.cfg.ID {
		t.Fatalf("the refused vote changed the follower: %+v", s)
	}
	higher := Ballot{Round: ballot.Round + 1, Node: 2}
	if r := answer(follower, Message{Type: MsgPrepare, Ballot: higher, Slot: 1}); r.Type != MsgPromise || r.Ballot != higher {
		t.Fatalf("the follower answered a Prepare at %v with %s at %v, want a Promise", higher, r.Type, r.Ballot)
	}
}
