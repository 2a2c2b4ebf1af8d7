package paxos

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// rejoinTransport is a node's endpoint that can lose every message one
// sender sends it (a leader's heartbeats not reaching a restarted node
// while its connection comes back, the others' reaching it), and records
// the rounds of the campaign refusals it got: the Seq of each Nack that
// answers one, by sender.
type rejoinTransport struct {
	Transport
	mu       sync.Mutex
	deaf     bool
	deafTo   NodeID
	refusals map[NodeID]map[uint64]bool
	out      chan Message
	once     sync.Once
}

func newRejoinTransport(tr Transport) *rejoinTransport {
	return &rejoinTransport{Transport: tr, refusals: map[NodeID]map[uint64]bool{}}
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
