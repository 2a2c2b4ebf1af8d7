package paxos

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// countingTransport counts what a node sends, by type, and the largest
// Accept.
type countingTransport struct {
	Transport
	mu       sync.Mutex
	byType   map[MsgType]int
	maxBatch int
	multi    int // Accepts with more than one entry
}

func (c *countingTransport) Send(m Message) error {
	c.mu.Lock()
	c.byType[m.Type]++
	if m.Type == MsgAccept {
		c.maxBatch = max(c.maxBatch, len(m.Entries))
		if len(m.Entries) > 1 {
			c.multi++
		}
	}
	c.mu.Unlock()
	return c.Transport.Send(m)
}

func (c *countingTransport) snapshot() (map[MsgType]int, int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[MsgType]int{}
	for k, v := range c.byType {
		out[k] = v
	}
	return out, c.maxBatch, c.multi
}

func TestNodePhase1OnceAndBatches(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	counters := map[NodeID]*countingTransport{}
	var mu sync.Mutex
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.MaxBatch = 8
		ct := &countingTransport{Transport: cfg.Transport, byType: map[MsgType]int{}}
		mu.Lock()
		counters[cfg.ID] = ct
		mu.Unlock()
		cfg.Transport = ct
	})
	defer c.close()
	c.startAll()
	lead := c.leader(5 * time.Second).cfg.ID
	before, _, _ := counters[lead].snapshot()

	var wg sync.WaitGroup
	for cl := range 32 {
		wg.Go(func() {
			for k := range 10 {
				c.mustPropose(lead, Command{Op: OpAcquire, Lock: fmt.Sprintf("l%d-%d", cl, k), Owner: "o", TTL: 600000})
			}
		})
	}
	wg.Wait()
	after, maxBatch, multi := counters[lead].snapshot()
	if after[MsgPrepare] != before[MsgPrepare] {
		t.Fatalf("the leader sent %d Prepares while leading: phase 1 should run once", after[MsgPrepare]-before[MsgPrepare])
	}
	accepts := after[MsgAccept] - before[MsgAccept]
	t.Logf("320 commands: %d Accepts to 2 followers, largest batch %d, %d batches of several", accepts, maxBatch, multi)
	if maxBatch > 8 {
		t.Fatalf("an Accept carried %d entries, above MaxBatch 8", maxBatch)
	}
	if multi == 0 || accepts >= 2*320 {
		t.Fatalf("no batching: %d Accepts for 320 commands", accepts)
	}
}

func TestNodeExpiryTicks(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, nil)
	defer c.close()
	c.startAll()
	lead := c.leader(5 * time.Second)
	res := c.mustPropose(1, Command{Op: OpAcquire, Lock: "short", Owner: "o", TTL: 30})
	if res.Code != CodeOK {
		t.Fatalf("acquire = %+v", res)
	}
	if lead.sm.NextExpiry() == 0 {
		t.Fatal("no expiry pending after a grant")
	}
	// The leader proposes a tick once the lock's time is up; every node
	// applies it and the table forgets the lock.
	deadline := time.Now().Add(3 * time.Second)
	for lead.sm.NextExpiry() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no tick removed the expired lock: next expiry %d", lead.sm.NextExpiry())
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // no further ticks while nothing expires
	c.converge(5 * time.Second)
	ticks := 0
	for _, e := range logOf(c.stopAndCompare()[0]) {
		if e.Cmd.Op == OpTick {
			ticks++
			if e.Cmd.Time < res.Lock.Expires {
				t.Fatalf("tick at %d before the expiry %d", e.Cmd.Time, res.Lock.Expires)
			}
		}
	}
	if ticks != 1 {
		t.Fatalf("%d ticks in the log, want 1", ticks)
	}
}

func TestNodeCommandTimesNeverGoBack(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	base := time.Now()
	var calls atomic.Int64
	c := newTestCluster(t, 3, func(cfg *Config) {
		// A clock that runs backwards: the leader must not.
		cfg.Now = func() time.Time { return base.Add(-time.Duration(calls.Add(1)) * time.Millisecond) }
	})
	defer c.close()
	c.startAll()
	c.leader(5 * time.Second)
	var last int64
	for k := range 30 {
		res := c.mustPropose(NodeID(k%3), Command{Op: OpAcquire, Lock: fmt.Sprintf("l%d", k), Owner: "o", TTL: 600000})
		if res.Lock.Acquired < last {
			t.Fatalf("grant %d at %d, before the previous grant at %d", k, res.Lock.Acquired, last)
		}
		last = res.Lock.Acquired
	}
	c.converge(5 * time.Second)
	c.stopAndCompare() // checks every slot's Time against the previous one
}

func TestNodePartitionedLeader(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, nil)
	defer c.close()
	c.startAll()
	old := c.leader(5 * time.Second)
	oldID, oldBallot := old.cfg.ID, old.Status().Ballot
	held := c.mustPropose(oldID, Command{Op: OpAcquire, Lock: "a", Owner: "o", TTL: 600000})

	c.net.Partition(oldID)
	// The cut-off leader cannot commit: its Propose times out.
	_, err := c.propose(oldID, Command{Op: OpAcquire, Lock: "minority", Owner: "o", TTL: 600000}, 300*time.Millisecond)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Propose on a minority leader = %v, want ErrTimeout", err)
	}
	// The majority elects a leader and goes on.
	other := (oldID + 1) % 3
	res := c.mustPropose(other, Command{Op: OpAcquire, Lock: "majority", Owner: "o", TTL: 600000})
	if res.Code != CodeOK {
		t.Fatalf("majority acquire = %+v", res)
	}
	if get := c.mustPropose(other, Command{Op: OpGet, Lock: "a"}); get.Lock.Token != held.Lock.Token {
		t.Fatalf("lock a after the partition: %+v", get)
	}
	c.net.Heal()
	// The old leader steps down, learns what was chosen without it, and the
	// command it could not commit may or may not have been chosen (it was
	// in its log only), but never twice.
	waitStatus(t, old, 5*time.Second, "follower", func(s NodeStatus) bool { return s.Role != "leader" || s.Ballot != oldBallot })
	c.mustPropose(oldID, Command{Op: OpGet, Lock: "majority"})
	c.converge(5 * time.Second)
	replay := NewTable(0)
	grants := 0
	for _, e := range logOf(c.stopAndCompare()[0]) {
		if r := replay.Apply(e.Slot, e.Cmd); e.Cmd.Lock == "minority" && r.Code == CodeOK && r.Index == e.Slot {
			grants++
		}
	}
	if grants > 1 {
		t.Fatalf("the minority's command was applied %d times", grants)
	}
}
