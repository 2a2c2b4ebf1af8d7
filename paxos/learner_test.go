package paxos

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// runClients has clients (spread over the given nodes) each take and free
// its own lock rounds times, and fails on any unexpected answer: a
// command applied twice would re-grant or refuse a release. It returns
// the command IDs with the result each got.
func runClients(t *testing.T, c *testCluster, nodes []NodeID, clients, rounds int) map[string]Result {
	t.Helper()
	var mu sync.Mutex
	got := map[string]Result{}
	var wg sync.WaitGroup
	for cl := range clients {
		wg.Go(func() {
			at := nodes[cl%len(nodes)]
			lock, owner := fmt.Sprintf("lock-%d", cl), fmt.Sprintf("client-%d", cl)
			for r := range rounds {
				id := fmt.Sprintf("c%d-r%d", cl, r)
				acq, err := c.propose(at, Command{Op: OpAcquire, ID: id + "-a", Lock: lock, Owner: owner, TTL: 600000}, 20*time.Second)
				if err != nil || acq.Code != CodeOK || acq.Lock.Token != acq.Index {
					t.Errorf("client %d round %d: acquire = %+v, %v", cl, r, acq, err)
					return
				}
				rel, err := c.propose(at, Command{Op: OpRelease, ID: id + "-r", Lock: lock, Owner: owner, Token: acq.Lock.Token}, 20*time.Second)
				if err != nil || rel.Code != CodeOK {
					t.Errorf("client %d round %d: release = %+v, %v", cl, r, rel, err)
					return
				}
				mu.Lock()
				got[id+"-a"], got[id+"-r"] = acq, rel
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return got
}

func TestNodeFaultyNetwork(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, nil,
		MemSeed(42), MemDropRate(0.10), MemDuplicateRate(0.05), MemDelay(0, 3*time.Millisecond))
	defer c.close()
	c.startAll()
	c.leader(5 * time.Second)

	start := time.Now()
	got := runClients(t, c, []NodeID{0, 1, 2}, 12, 45) // 1,080 commands
	if t.Failed() {
		return
	}
	c.net.SetDropRate(0)
	c.converge(10 * time.Second)
	st := c.net.Stats()
	stopped := c.stopAndCompare()
	t.Logf("%d commands in %s over a network that dropped %d, duplicated %d of %d messages",
		len(got), time.Since(start).Round(time.Millisecond), st.Dropped, st.Duplicated, st.Sent)
	if st.Dropped == 0 || st.Duplicated == 0 {
		t.Fatalf("no faults were injected: %+v", st)
	}

	// Each command is in the log, and its result came from its first slot
	// (a retried forward may land again, but is not applied again).
	first := map[string]uint64{}
	for _, e := range logOf(stopped[0]) {
		if _, ok := first[e.Cmd.ID]; !ok {
			first[e.Cmd.ID] = e.Slot
		}
	}
	for id, res := range got {
		if s, ok := first[id]; !ok || s != res.Index {
			t.Fatalf("command %s: result index %d, first in the log at %d (present %v)", id, res.Index, s, ok)
		}
	}
}

func TestNodeRestartFromSnapshotAndLog(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.SnapshotEvery = 100 })
	defer c.close()
	c.startAll()
	c.leader(5 * time.Second)
	runClients(t, c, []NodeID{0, 1, 2}, 6, 29) // 348 commands + no-ops
	held := c.mustPropose(1, Command{Op: OpAcquire, Lock: "kept", Owner: "o", TTL: 600000})
	c.converge(5 * time.Second)

	before := map[NodeID][]byte{}
	applied := map[NodeID]uint64{}
	for id, n := range c.stopAndCompare() {
		before[id], applied[id] = tableBytes(t, n), n.applied
		// A snapshot is due once the log holds SnapshotEvery entries and a
		// quarter as many as the last snapshot had items (the dedupe
		// memory), unless one is being saved.
		if due := max(100, n.snapItems/snapItemsPerEntry); n.snapIndex() == 0 || n.snapItems == 0 ||
			!n.snapping && n.applied-n.snapIndex() >= due {
			t.Fatalf("node %d: snapshot at %d, applied %d, last snapshot's items %d: want one every %d entries",
				id, n.snapIndex(), n.applied, n.snapItems, due)
		}
		if n.applied == n.snapIndex() {
			t.Fatalf("node %d: nothing above the snapshot; the test wants snapshot plus log", id)
		}
	}
	// A new Node on the same dir recovers the same state before it hears
	// from anyone.
	for id := range before {
		n, err := NewNode(c.config(id, c.peers))
		if err != nil {
			t.Fatal(err)
		}
		if n.applied != applied[id] || !bytes.Equal(tableBytes(t, n), before[id]) {
			t.Fatalf("node %d after restart: applied %d (was %d), table equal %v",
				id, n.applied, applied[id], bytes.Equal(tableBytes(t, n), before[id]))
		}
		if err := n.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	c.startAll()
	get := c.mustPropose(2, Command{Op: OpGet, Lock: "kept"})
	if get.Code != CodeOK || get.Lock.Token != held.Lock.Token {
		t.Fatalf("after restart: %+v, want the lock with token %d", get, held.Lock.Token)
	}
	c.converge(5 * time.Second)
	c.stopAndCompare()
}

func TestNodeCatchesUp(t *testing.T) {
	for _, tc := range []struct {
		name          string
		snapshotEvery uint64
		bySnapshot    bool
		// snapshotted: the others snapshot past node 2's commit while it
		// is down, by fewer entries than they keep below a snapshot.
		snapshotted bool
	}{
		{name: "by log", snapshotEvery: 10000},
		{name: "by snapshot", snapshotEvery: 100, bySnapshot: true},
		// 700: nodes 0 and 1 take their first snapshot (at 700 and 933)
		// within the 1,000 commands and no second one.
		{name: "by the entries kept below a snapshot", snapshotEvery: 700, snapshotted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			var snapshotsSent atomic.Int64
			c := newTestCluster(t, 3, func(cfg *Config) {
				cfg.SnapshotEvery = tc.snapshotEvery
				cfg.Transport = &spyTransport{Transport: cfg.Transport, snapshots: &snapshotsSent}
			})
			defer c.close()
			c.startAll()
			c.leader(5 * time.Second)
			c.mustPropose(2, Command{Op: OpAcquire, Lock: "early", Owner: "o", TTL: 600000})
			c.converge(5 * time.Second)
			c.stop(2)
			behind := c.running()[0].Status().Commit

			runClients(t, c, []NodeID{0, 1}, 10, 50) // 1,000 commands while node 2 is down
			lead := c.converge(5 * time.Second)
			if lead < behind+1000 {
				t.Fatalf("commit %d, want at least %d", lead, behind+1000)
			}
			if tc.snapshotted {
				deadline := time.Now().Add(10 * time.Second)
				for _, r := range c.running() {
					for r.Status().SnapshotIndex <= behind {
						if time.Now().After(deadline) {
							t.Fatalf("node %d did not snapshot past %d", r.cfg.ID, behind)
						}
						time.Sleep(10 * time.Millisecond)
					}
				}
			}
			n := c.start(2)
			start := time.Now()
			c.converge(20 * time.Second)
			t.Logf("node 2 caught up %d slots in %s", lead-behind, time.Since(start).Round(time.Millisecond))
			if sent := snapshotsSent.Load(); tc.bySnapshot != (sent > 0) {
				t.Fatalf("%d snapshots sent; want some only when catching up by snapshot", sent)
			}
			if s := n.Status(); tc.bySnapshot && s.SnapshotIndex <= behind+100 {
				t.Fatalf("node 2 snapshot index %d: it should have installed a peer's snapshot past %d", s.SnapshotIndex, behind)
			}
			if s := n.Status(); !tc.bySnapshot && s.SnapshotsInstalled != 0 {
				t.Fatalf("node 2 installed %d snapshots; want it caught up from entries", s.SnapshotsInstalled)
			}
			// It serves reads and takes part again.
			c.mustPropose(2, Command{Op: OpGet, Lock: "early"})
			c.stop(0)
			res := c.mustPropose(2, Command{Op: OpAcquire, Lock: "late", Owner: "o", TTL: 600000})
			if res.Code != CodeOK {
				t.Fatalf("acquire with node 0 down = %+v", res)
			}
			c.converge(5 * time.Second)
			c.stopAndCompare()
		})
	}
}

// spyTransport counts the snapshots a node sends.
type spyTransport struct {
	Transport
	snapshots *atomic.Int64
}

func (s *spyTransport) Send(m Message) error {
	if m.Type == MsgCatchUpReply && m.Snapshot != nil {
		s.snapshots.Add(1)
	}
	return s.Transport.Send(m)
}
