package paxos

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// grantLog records every grant clients saw, to check none was given twice.
type grantLog struct {
	mu     sync.Mutex
	grants map[string][]LockState // by lock name
}

func (g *grantLog) add(ls LockState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.grants == nil {
		g.grants = map[string][]LockState{}
	}
	g.grants[ls.Name] = append(g.grants[ls.Name], ls)
}

// checkNoOverlap fails when two grants of one lock (never released)
// overlap in time, or share a token.
func (g *grantLog) checkNoOverlap(t *testing.T) {
	g.checkTokens(t)
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, gs := range g.grants {
		for i := 1; i < len(gs); i++ {
			if gs[i].Acquired < gs[i-1].Expires {
				t.Fatalf("lock %s granted twice at once: %+v then %+v", name, gs[i-1], gs[i])
			}
		}
	}
}

// checkTokens fails when two grants of one lock share a token, or a later
// grant has a smaller token.
func (g *grantLog) checkTokens(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, gs := range g.grants {
		slices.SortFunc(gs, func(a, b LockState) int { return int(a.Token) - int(b.Token) })
		for i := 1; i < len(gs); i++ {
			if gs[i].Token == gs[i-1].Token || gs[i].Acquired < gs[i-1].Acquired {
				t.Fatalf("lock %s: grants %+v and %+v: a token granted twice, or tokens out of time order", name, gs[i-1], gs[i])
			}
		}
	}
}

// TestNodeLeaderStopped stops the leader under load, with the default
// heartbeat (50ms) and election timeout (500ms): a new leader within 3 s,
// no chosen command lost, nothing granted twice.
func TestNodeLeaderStopped(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.Heartbeat, cfg.ElectionTimeout = 0, 0 })
	defer c.close()
	c.startAll()
	old := c.leader(5 * time.Second)
	oldID := old.cfg.ID
	other := (oldID + 1) % 3

	held := c.mustPropose(other, Command{Op: OpAcquire, Lock: "held", Owner: "keeper", TTL: 600000})
	if held.Code != CodeOK {
		t.Fatalf("acquire = %+v", held)
	}

	// Clients keep competing for a few locks (long TTLs: a lock once
	// granted stays held) through the failover.
	var grants grantLog
	stopClients := raceForLocks(c, []NodeID{(oldID + 1) % 3, (oldID + 2) % 3}, &grants)
	time.Sleep(50 * time.Millisecond)

	stoppedAt := time.Now()
	c.stop(oldID)
	var elected time.Duration
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && elected == 0; time.Sleep(time.Millisecond) {
		for _, n := range c.running() {
			if s := n.Status(); s.Role == "leader" && old.promised.Less(s.Ballot) {
				elected = time.Since(stoppedAt)
			}
		}
	}
	if elected == 0 || elected > 3*time.Second {
		t.Fatalf("no new leader within 3s of stopping leader %d (took %s)", oldID, elected)
	}
	res := c.mustPropose(other, Command{Op: OpRenew, Lock: "held", Owner: "keeper", Token: held.Lock.Token, TTL: 600000})
	progressed := time.Since(stoppedAt)
	t.Logf("leader %d stopped: new leader after %s, first command committed after %s (election timeout %s)",
		oldID, elected, progressed, c.node(other).cfg.ElectionTimeout)
	if res.Code != CodeOK {
		t.Fatalf("renew of the lock held before the failover = %+v: lost", res)
	}
	stopClients()

	get := c.mustPropose(other, Command{Op: OpGet, Lock: "held"})
	if get.Code != CodeOK || get.Lock.Token != held.Lock.Token || get.Lock.Owner != "keeper" {
		t.Fatalf("after failover the lock is %+v, want token %d held by keeper", get, held.Lock.Token)
	}
	again := c.mustPropose(other, Command{Op: OpAcquire, Lock: "held", Owner: "thief", TTL: 1000})
	if again.Code != CodeHeld {
		t.Fatalf("acquire by another owner after failover = %+v, want held", again)
	}
	grants.checkNoOverlap(t)
	for name, gs := range grants.grants {
		if len(gs) != 1 {
			t.Fatalf("lock %s granted %d times (never released): %+v", name, len(gs), gs)
		}
	}

	// The old leader comes back and agrees.
	c.start(oldID)
	c.mustPropose(oldID, Command{Op: OpGet, Lock: "held"})
	c.converge(5 * time.Second)
	c.stopAndCompare()
}

// raceForLocks starts a client at each node that keeps trying to take
// one of four locks (never released), recording the grants; errors are
// expected while there is no leader. The returned func stops them.
func raceForLocks(c *testCluster, at []NodeID, grants *grantLog) func() {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, id := range at {
		wg.Go(func() {
			for k := 0; !stop.Load() && k < 10000; k++ {
				lock := fmt.Sprintf("race-%d", k%4)
				res, err := c.propose(id, Command{Op: OpAcquire, Lock: lock, Owner: fmt.Sprintf("c%d", id), TTL: 600000}, 3*time.Second)
				if err == nil && res.Code == CodeOK {
					grants.add(res.Lock)
				}
			}
		})
	}
	return func() { stop.Store(true); wg.Wait() }
}

// TestNodeDuelingCandidatesNoLivelock makes two nodes campaign at the same
// instant, 1,000 times, and requires each time a leader that commits a
// command within a bound: the randomized election timeout and the
// randomized backoff after a pre-emption break every tie.
func TestNodeDuelingCandidatesNoLivelock(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	trials := 1000
	if testing.Short() {
		trials = 100
	}
	const bound = 2 * time.Second
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.Heartbeat = 2 * time.Millisecond
		cfg.ElectionTimeout = 20 * time.Millisecond
	}, MemDelay(0, 500*time.Microsecond))
	defer c.close()
	c.startAll()
	c.leader(5 * time.Second)
	a, b := c.node(0), c.node(1)

	took := make([]time.Duration, 0, trials)
	preempted := 0
	for i := range trials {
		before := b.Status().Ballot
		start := time.Now()
		var kick sync.WaitGroup
		kick.Go(a.campaignNow)
		kick.Go(b.campaignNow)
		kick.Wait()
		res, err := c.propose(2, Command{Op: OpAcquire, Lock: fmt.Sprintf("l%d", i), Owner: "o", TTL: 600000}, bound)
		d := time.Since(start)
		if err != nil || res.Code != CodeOK {
			t.Fatalf("trial %d: no progress within %s: %v %+v; statuses %+v %+v %+v",
				i, bound, err, res, a.Status(), b.Status(), c.node(2).Status())
		}
		if s := b.Status().Ballot; s.Round > before.Round+1 {
			preempted++ // it took more than one round to settle
		}
		took = append(took, d)
	}
	slices.Sort(took)
	p50, p99, worst := took[len(took)/2], took[len(took)*99/100], took[len(took)-1]
	t.Logf("%d trials of two simultaneous candidates: time to a committed command p50 %s, p99 %s, max %s; %d needed more than one round",
		trials, p50, p99, worst, preempted)
	if worst > bound {
		t.Fatalf("max time to progress %s above %s", worst, bound)
	}
	c.converge(5 * time.Second)
	c.stopAndCompare()
}

// TestNodeStaleMessagesAreHarmless replays old and duplicated protocol
// messages from a fake member at a running group: nothing changes but
// what should.
func TestNodeStaleMessagesAreHarmless(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, nil)
	defer c.close()
	c.start(0)
	c.start(1)
	lead := c.leader(5 * time.Second)
	res := c.mustPropose(lead.cfg.ID, Command{Op: OpAcquire, Lock: "a", Owner: "o", TTL: 600000})

	// Node 2's endpoint is driven by hand: it is a member, so its messages
	// count.
	fake := c.net.Transport(2)
	ballot := lead.Status().Ballot
	target := NodeID(0)
	if lead.cfg.ID == 0 {
		target = 1
	}
	stale := Ballot{Round: 0, Node: 2}
	send := func(m Message) {
		m.Group, m.To = "test", target
		if err := fake.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	// A stale Accept for the granted slot with another value, a stale
	// Prepare, a duplicated promise and an Accepted for a slot never
	// proposed: the follower must Nack or ignore them all.
	send(Message{Type: MsgAccept, Ballot: stale, Entries: []Entry{{Slot: res.Index, Ballot: stale, Cmd: Command{Op: OpRelease, Lock: "a", Owner: "o", Token: res.Index}}}})
	send(Message{Type: MsgPrepare, Ballot: stale, Slot: 1})
	send(Message{Type: MsgPromise, Ballot: ballot})
	send(Message{Type: MsgAccepted, Ballot: ballot, Slot: 1000, Last: 1005})
	nacks := 0
	deadline := time.After(time.Second)
	for nacks < 2 {
		select {
		case m := <-fake.Recv():
			if m.Type == MsgNack {
				if m.Ballot != ballot {
					t.Fatalf("nack carries %s, want the promise %s", m.Ballot, ballot)
				}
				nacks++
			}
			if m.Type == MsgPromise || m.Type == MsgAccepted {
				t.Fatalf("stale message was answered with %s", m.Type)
			}
		case <-deadline:
			t.Fatalf("got %d nacks, want 2", nacks)
		}
	}
	get := c.mustPropose(target, Command{Op: OpGet, Lock: "a"})
	if get.Code != CodeOK || get.Lock.Token != res.Index {
		t.Fatalf("after stale messages the lock is %+v", get)
	}
	if s := lead.Status(); s.Role != "leader" || s.Ballot != ballot {
		t.Fatalf("stale messages disturbed the leader: %+v", s)
	}

}
