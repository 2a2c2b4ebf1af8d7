package paxos

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// invariantTransport checks, as each message leaves a node (Send runs on
// the node's own loop goroutine, so it may read the node's state), that:
//   - an Accepted or a Promise goes out only once the state it reports is
//     in the node's storage, as the log's records put it there (the
//     writer fsyncs a record before it updates that state);
//   - a leader proposes no slot past an undecided membership change.
type invariantTransport struct {
	Transport
	mu         sync.Mutex
	node       *Node
	violations []string
	checked    int
}

func (it *invariantTransport) Send(m Message) error {
	it.mu.Lock()
	if n := it.node; n != nil {
		it.checked++
		if v := checkSend(n, m); v != "" {
			it.violations = append(it.violations, v)
		}
	}
	it.mu.Unlock()
	return it.Transport.Send(m)
}

func checkSend(n *Node, m Message) string {
	switch m.Type {
	case MsgAccepted:
		for slot := m.Slot; slot <= m.Last; slot++ {
			if !storedAt(n, slot, m.Ballot, true) {
				return fmt.Sprintf("node %d sent Accepted %d..%d at %s before slot %d was durable", n.cfg.ID, m.Slot, m.Last, m.Ballot, slot)
			}
		}
		if storedPromise(n).Less(m.Ballot) {
			return fmt.Sprintf("node %d sent Accepted at %s before its promise was durable", n.cfg.ID, m.Ballot)
		}
	case MsgPromise:
		for _, e := range m.Entries {
			if !storedAt(n, e.Slot, e.Ballot, false) {
				return fmt.Sprintf("node %d promised %s reporting slot %d at %s, not durable", n.cfg.ID, m.Ballot, e.Slot, e.Ballot)
			}
		}
		if storedPromise(n) != m.Ballot {
			return fmt.Sprintf("node %d promised %s with its promise not durable", n.cfg.ID, m.Ballot)
		}
	case MsgAccept:
		for _, e := range m.Entries {
			for s := n.applied + 1; s < e.Slot; s++ {
				if p, ok := n.entry(s); ok && isChange(p.Cmd) && n.lead != nil && s >= n.lead.first {
					return fmt.Sprintf("node %d proposed slot %d past the undecided change at %d", n.cfg.ID, e.Slot, s)
				}
			}
		}
	}
	return ""
}

// storedPromise is the promise in n's storage.
func storedPromise(n *Node) Ballot {
	n.store.mu.Lock()
	defer n.store.mu.Unlock()
	return n.store.st.promised
}

// storedAt reports whether n's storage holds slot accepted at ballot b
// (or, with atLeast, at b or a later ballot), or covers it otherwise: by
// its snapshot, or as chosen (an Accept repeating a chosen slot is
// answered without taking it again).
func storedAt(n *Node, slot uint64, b Ballot, atLeast bool) bool {
	n.store.mu.Lock()
	defer n.store.mu.Unlock()
	if slot <= n.store.snapIndex {
		return true
	}
	raw, ok := n.store.st.entries.get(slot)
	var e Entry
	if !ok || json.Unmarshal(raw, &e) != nil {
		return false
	}
	return slot <= n.store.st.commit || e.Ballot == b || (atLeast && b.Less(e.Ballot))
}

func TestNodeInvariantsUnderFaultsAndChanges(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var mu sync.Mutex
	spies := map[*invariantTransport]bool{}
	c := newTestCluster(t, 5, func(cfg *Config) {
		it := &invariantTransport{Transport: cfg.Transport}
		mu.Lock()
		spies[it] = true
		mu.Unlock()
		cfg.Transport = it
	}, MemSeed(5), MemDropRate(0.05), MemDuplicateRate(0.05), MemDelay(0, 2*time.Millisecond))
	defer c.close()
	founders := c.peers[:3]
	start := func(id NodeID, peers []Peer) {
		n := c.startWith(id, peers)
		it := n.cfg.Transport.(*invariantTransport)
		it.mu.Lock()
		it.node = n
		it.mu.Unlock()
	}
	for _, p := range founders {
		start(p.ID, founders)
	}
	c.leader(5 * time.Second)
	load := startLoad(t, c, []NodeID{0, 1, 2}, 6)
	load.more(t, "before the changes")

	// Two additions at once: they are chosen one after the other.
	start(3, founders)
	start(4, founders)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range c.peers[3:] {
		wg.Go(func() {
			if err := c.node(p.ID%3).AddNode(ctx, p); err != nil {
				t.Errorf("add %d: %v", p.ID, err)
			}
		})
	}
	wg.Wait()
	load.more(t, "after the additions")
	if err := c.node(0).RemoveNode(ctx, 3); err != nil {
		t.Fatal(err)
	}
	load.more(t, "after the removal")
	load.halt()
	c.stop(3)
	c.net.SetDropRate(0)
	c.converge(10 * time.Second)
	checked := 0
	for it := range spies {
		it.mu.Lock()
		checked += it.checked
		for _, v := range it.violations {
			t.Error(v)
		}
		it.node = nil // the nodes stop below; the spies check nothing more
		it.mu.Unlock()
	}
	t.Logf("%d messages checked, %d load cycles", checked, load.cycles.Load())
	c.stopAndCompare()
}
