package paxos

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// deafTransport can stop delivering to its node while the node's sends
// still go out: a one-way failure (a consumer gone while the publisher
// lives, a firewall rule in one direction).
type deafTransport struct {
	Transport
	deaf atomic.Bool
	out  chan Message
	once sync.Once
}

// Recv relays the inner endpoint's messages unless deaf; it closes when
// the inner endpoint does, which ends the relay.
func (d *deafTransport) Recv() <-chan Message {
	d.once.Do(func() {
		d.out = make(chan Message, 1024)
		go func() {
			defer close(d.out)
			for m := range d.Transport.Recv() {
				if d.deaf.Load() {
					continue
				}
				select {
				case d.out <- m:
				default: // full: lost, as on a real network
				}
			}
		}()
	})
	return d.out
}

// TestDeafLeaderIsReplaced: a leader that still sends heartbeats
// but hears nothing (no acks, no forwards) can commit nothing. It must
// give up leadership so the others, who hear it, elect a leader that can;
// otherwise its heartbeats hold the group still for good.
func TestDeafLeaderIsReplaced(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var mu sync.Mutex
	ears := map[NodeID]*deafTransport{}
	c := newTestCluster(t, 3, func(cfg *Config) {
		d := &deafTransport{Transport: cfg.Transport}
		mu.Lock()
		ears[cfg.ID] = d
		mu.Unlock()
		cfg.Transport = d
	})
	defer c.close()
	c.startAll()
	lead := c.leader(5 * time.Second).cfg.ID
	c.mustPropose(lead, Command{Op: OpAcquire, Lock: "before", Owner: "o", TTL: 600000})

	mu.Lock()
	ears[lead].deaf.Store(true)
	mu.Unlock()
	other := (lead + 1) % 3
	start := time.Now()
	res, err := c.propose(other, Command{Op: OpAcquire, Lock: "after", Owner: "o", TTL: 600000}, 5*time.Second)
	if err != nil || res.Code != CodeOK {
		t.Fatalf("with leader %d deaf, acquire at node %d = %+v, %v; statuses %+v / %+v",
			lead, other, res, err, c.node(other).Status(), c.node(lead).Status())
	}
	t.Logf("leader %d deaf: a command committed after %s", lead, time.Since(start).Round(time.Millisecond))
	// The group keeps working while the deaf node stays deaf.
	for k := range 20 {
		res, err := c.propose(other, Command{Op: OpGet, Lock: "after"}, 5*time.Second)
		if err != nil || res.Code != CodeOK {
			t.Fatalf("read %d with node %d deaf = %+v, %v", k, lead, res, err)
		}
	}
	mu.Lock()
	ears[lead].deaf.Store(false)
	mu.Unlock()
	c.mustPropose(lead, Command{Op: OpGet, Lock: "after"})
	c.converge(5 * time.Second)
	c.stopAndCompare()
}

// TestIsolatedLeaderStepsDown: a leader cut off from everyone gives
// up leadership within two election timeouts, dropping what it queued
// (every request sent to it meanwhile was kept, without bound, while it
// went on believing it led); its callers time out, and after the heal it
// learns what the others chose.
func TestIsolatedLeaderStepsDown(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, nil)
	defer c.close()
	c.startAll()
	old := c.leader(5 * time.Second)
	c.net.Isolate(old.cfg.ID)
	for k := range 50 {
		if _, err := c.propose(old.cfg.ID, Command{Op: OpGet, Lock: fmt.Sprint("l", k)}, 5*time.Millisecond); err == nil {
			t.Fatal("an isolated leader answered")
		}
	}
	window := 2 * old.cfg.ElectionTimeout
	s := waitStatus(t, old, window+time.Second, "not leading", func(s NodeStatus) bool { return s.Role != "leader" })
	t.Logf("isolated leader %d now %s", old.cfg.ID, s.Role)
	other := (old.cfg.ID + 1) % 3
	res := c.mustPropose(other, Command{Op: OpAcquire, Lock: "majority", Owner: "o", TTL: 600000})
	c.net.Heal()
	get := c.mustPropose(old.cfg.ID, Command{Op: OpGet, Lock: "majority"})
	if get.Code != CodeOK || get.Lock.Token != res.Lock.Token {
		t.Fatalf("after the heal the old leader reads %+v, want token %d", get, res.Lock.Token)
	}
	c.converge(5 * time.Second)
	c.stopAndCompare()
}
