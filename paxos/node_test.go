package paxos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// testCluster is a group of real nodes (real storage in t.TempDir()) over
// one MemNetwork. A crash is Stop and a new Node on the same data dir.
type testCluster struct {
	t     *testing.T
	net   *MemNetwork
	peers []Peer
	dirs  map[NodeID]string
	tune  func(*Config)

	mu    sync.Mutex // guards nodes: clients run beside the test
	nodes map[NodeID]*Node
}

// node returns the running node id (nil if none).
func (c *testCluster) node(id NodeID) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// running returns the running nodes.
func (c *testCluster) running() map[NodeID]*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[NodeID]*Node{}
	for id, n := range c.nodes {
		out[id] = n
	}
	return out
}

// newTestCluster makes (without starting) a group of size nodes, ids
// 0..size-1. tune adjusts every node's Config.
func newTestCluster(t *testing.T, size int, tune func(*Config), opts ...MemOption) *testCluster {
	t.Helper()
	c := &testCluster{t: t, net: NewMemNetwork(opts...), dirs: map[NodeID]string{}, nodes: map[NodeID]*Node{}, tune: tune}
	for i := range size {
		c.peers = append(c.peers, Peer{ID: NodeID(i), Addr: fmt.Sprintf("127.0.0.1:%d", 7100+i)})
	}
	return c
}

func testLogger() *slog.Logger {
	if os.Getenv("PAXOS_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// config is node id's Config: fast timers, the cluster's peers.
func (c *testCluster) config(id NodeID, peers []Peer) Config {
	if c.dirs[id] == "" {
		c.dirs[id] = c.t.TempDir()
	}
	cfg := Config{
		ID: id, Group: "test", Peers: peers, Transport: c.net.Transport(id), DataDir: c.dirs[id],
		Heartbeat: 10 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, Logger: testLogger(),
	}
	if c.tune != nil {
		c.tune(&cfg)
	}
	return cfg
}

// start starts node id (a new Node on its data dir).
func (c *testCluster) start(id NodeID) *Node { return c.startWith(id, c.peers) }

// startWith starts node id with the given initial peers.
func (c *testCluster) startWith(id NodeID, peers []Peer) *Node {
	c.t.Helper()
	n, err := NewNode(c.config(id, peers))
	if err != nil {
		c.t.Fatalf("new node %d: %v", id, err)
	}
	if err := n.Start(context.Background()); err != nil {
		c.t.Fatalf("start node %d: %v", id, err)
	}
	c.mu.Lock()
	c.nodes[id] = n
	c.mu.Unlock()
	return n
}

// startAll starts every node.
func (c *testCluster) startAll() {
	for _, p := range c.peers {
		c.start(p.ID)
	}
}

// stop stops node id and closes its endpoint (a crash, as far as the
// others can tell: messages in flight to it are lost).
func (c *testCluster) stop(id NodeID) {
	c.t.Helper()
	c.mu.Lock()
	n := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	if n != nil {
		if err := n.Stop(); err != nil {
			c.t.Errorf("stop node %d: %v", id, err)
		}
		// What was in flight to the crashed node is lost with it.
		_ = n.cfg.Transport.Close()
	}
}

// close stops every node and the network.
func (c *testCluster) close() {
	for id := range c.running() {
		c.stop(id)
	}
	_ = c.net.Close()
}

// leader waits for a node that reports itself leader.
func (c *testCluster) leader(within time.Duration) *Node {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, n := range c.running() {
			if n.Status().Role == "leader" {
				return n
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	c.t.Fatalf("no leader within %s", within)
	return nil
}

// propose proposes cmd at node id with a timeout.
func (c *testCluster) propose(id NodeID, cmd Command, within time.Duration) (Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	n := c.node(id)
	if n == nil {
		return Result{}, fmt.Errorf("node %d is not running", id)
	}
	return n.Propose(ctx, cmd)
}

// mustPropose proposes and fails the test on error.
func (c *testCluster) mustPropose(id NodeID, cmd Command) Result {
	c.t.Helper()
	res, err := c.propose(id, cmd, 10*time.Second)
	if err != nil {
		c.t.Fatalf("propose %s %s at node %d: %v", cmd.Op, cmd.Lock, id, err)
	}
	return res
}

// converge waits until every running node has applied the same index,
// and that index is the leader's commit.
func (c *testCluster) converge(within time.Duration) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(within)
	var last []NodeStatus
	for time.Now().Before(deadline) {
		last = last[:0]
		var lead uint64
		same := true
		for _, n := range c.running() {
			s := n.Status()
			last = append(last, s)
			if s.Role == "leader" {
				lead = s.Commit
			}
			if s.Applied != last[0].Applied {
				same = false
			}
		}
		if same && lead != 0 && last[0].Applied == lead {
			return lead
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("nodes did not converge within %s: %+v", within, last)
	return 0
}

// logOf returns a stopped node's chosen log above its snapshot, by slot.
func logOf(n *Node) []Entry {
	var out []Entry
	for s := n.snapIndex() + 1; s <= n.commit; s++ {
		e, _ := n.entry(s)
		out = append(out, e)
	}
	return out
}

// tableBytes returns a stopped (or not yet started) node's table snapshot.
func tableBytes(t *testing.T, n *Node) []byte {
	t.Helper()
	b, err := n.sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// quiesce converges, then cuts every node off and checks that they still
// agree (nothing was chosen in between), so that stopping them one by one
// compares like with like. The network stays cut (stopAndCompare heals
// it once the nodes are stopped).
func (c *testCluster) quiesce() {
	c.t.Helper()
	for range 20 {
		c.converge(10 * time.Second)
		for id := range c.running() {
			c.net.Isolate(id)
		}
		time.Sleep(20 * time.Millisecond) // delayed messages land
		applied := map[uint64]bool{}
		for _, n := range c.running() {
			applied[n.Status().Applied] = true
		}
		if len(applied) == 1 {
			return
		}
		c.net.Heal()
	}
	c.t.Fatal("the nodes never stood still")
}

// stopAndCompare stops every node and checks that their tables are equal
// and their logs hold the same commands in the same slots.
func (c *testCluster) stopAndCompare() map[NodeID]*Node {
	c.t.Helper()
	c.quiesce()
	stopped := c.running()
	for id := range stopped {
		c.stop(id)
	}
	c.net.Heal()
	var ref *Node
	for _, n := range stopped {
		if ref == nil || n.cfg.ID < ref.cfg.ID {
			ref = n
		}
	}
	for _, n := range stopped {
		if n.applied != ref.applied {
			c.t.Errorf("node %d applied %d, node %d applied %d", n.cfg.ID, n.applied, ref.cfg.ID, ref.applied)
		}
		if a, b := tableBytes(c.t, n), tableBytes(c.t, ref); string(a) != string(b) {
			c.t.Errorf("node %d's table differs from node %d's", n.cfg.ID, ref.cfg.ID)
		}
		lo := max(n.snapIndex(), ref.snapIndex()) + 1
		for s := lo; s <= min(n.commit, ref.commit); s++ {
			ea, _ := n.entry(s)
			eb, _ := ref.entry(s)
			a, b := ea.Cmd, eb.Cmd
			if a.ID != b.ID || a.Op != b.Op || a.Time != b.Time || a.Lock != b.Lock {
				c.t.Fatalf("slot %d: node %d has %+v, node %d has %+v", s, n.cfg.ID, a, ref.cfg.ID, b)
			}
		}
		// A slot's command Time may be below an earlier slot's: a leader
		// stamps in slot order, but one that recovers re-proposes each
		// slot's value of the highest ballot it finds, and two dueling
		// leaders' values can interleave (slot s from the newer, s+1
		// from the older). What holds is the table's: it applies each
		// command at the greater of its Time and the time before, so its
		// time never runs backwards and ends at the greatest Time applied.
		var most int64
		for s := uint64(1); n.snapIndex() == 0 && s <= n.applied; s++ {
			e, _ := n.entry(s)
			most = max(most, e.Cmd.Time)
		}
		if n.snapIndex() == 0 && n.applied > 0 && n.sm.Now() != most {
			c.t.Fatalf("node %d: the table's time is %d, the greatest command Time applied %d", n.cfg.ID, n.sm.Now(), most)
		}
	}
	return stopped
}

func TestConfigValidate(t *testing.T) {
	tr := NewMemNetwork().Transport(1)
	base := func() Config {
		return Config{ID: 1, Peers: []Peer{{ID: 1}}, Transport: tr, DataDir: t.TempDir()}
	}
	cases := []struct {
		name    string
		edit    func(*Config)
		wantErr string
	}{
		{name: "defaults", edit: func(*Config) {}},
		{name: "no transport", edit: func(c *Config) { c.Transport = nil }, wantErr: "Transport is required"},
		{name: "no data dir", edit: func(c *Config) { c.DataDir = "" }, wantErr: "DataDir is required"},
		{name: "no peers", edit: func(c *Config) { c.Peers = nil }, wantErr: "Peers is required"},
		{name: "duplicate peer", edit: func(c *Config) { c.Peers = []Peer{{ID: 1}, {ID: 1}} }, wantErr: "listed twice"},
		{name: "election below heartbeat", edit: func(c *Config) {
			c.Heartbeat, c.ElectionTimeout = time.Second, time.Second
		}, wantErr: "must be above Heartbeat"},
		{name: "negative", edit: func(c *Config) { c.LockDelay = -1 }, wantErr: "must not be negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			err := c.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.Group != DefaultGroup || c.Heartbeat != DefaultHeartbeat || c.ElectionTimeout != DefaultElectionTimeout ||
					c.SnapshotEvery != DefaultSnapshotEvery || c.MaxBatch != DefaultMaxBatch || c.Now == nil || c.Logger == nil {
					t.Fatalf("defaults not filled in: %+v", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
			}
		})
	}
}

func TestNodeLifecycle(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 1, nil)
	defer c.close()

	t.Run("stop before start, twice", func(t *testing.T) {
		n, err := NewNode(c.config(0, c.peers))
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Status(); got.Role != "follower" || got.ID != 0 {
			t.Fatalf("status before start = %+v", got)
		}
		if err := n.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := n.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := n.Start(context.Background()); !errors.Is(err, ErrStopped) {
			t.Fatalf("Start after Stop = %v, want ErrStopped", err)
		}
		if _, err := n.Propose(context.Background(), Command{Op: OpGet, Lock: "x"}); !errors.Is(err, ErrStopped) {
			t.Fatalf("Propose after Stop = %v, want ErrStopped", err)
		}
	})

	t.Run("single node commits, stops twice", func(t *testing.T) {
		n := c.start(0)
		if err := n.Start(context.Background()); err != nil {
			t.Fatalf("second Start = %v", err)
		}
		res := c.mustPropose(0, Command{Op: OpAcquire, Lock: "a", Owner: "o", TTL: 60000})
		if res.Code != CodeOK || res.Lock.Token != res.Index || res.Index == 0 {
			t.Fatalf("acquire = %+v", res)
		}
		if s := n.Status(); s.Role != "leader" || s.Commit < res.Index || len(s.Members) != 1 {
			t.Fatalf("status = %+v", s)
		}
		c.stop(0)
		if err := n.Stop(); err != nil {
			t.Fatal(err)
		}
		if got := n.Status(); got.Applied < res.Index {
			t.Fatalf("status after stop = %+v", got)
		}
	})

	t.Run("context cancel stops the node", func(t *testing.T) {
		n, err := NewNode(c.config(0, c.peers))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if err := n.Start(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		<-n.done
		if _, err := n.Propose(context.Background(), Command{Op: OpGet, Lock: "x"}); !errors.Is(err, ErrStopped) {
			t.Fatalf("Propose after cancel = %v, want ErrStopped", err)
		}
		if err := n.Start(context.Background()); !errors.Is(err, ErrStopped) {
			t.Fatalf("Start after cancel = %v, want ErrStopped", err)
		}
		_ = n.Stop()
	})

	t.Run("propose times out without quorum", func(t *testing.T) {
		c2 := newTestCluster(t, 3, nil)
		defer c2.close()
		c2.start(0) // alone: no majority
		_, err := c2.propose(0, Command{Op: OpGet, Lock: "x"}, 150*time.Millisecond)
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrTimeout wrapping context.DeadlineExceeded", err)
		}
	})
}

func TestNodeRefusesOtherGroupsDataDir(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 1, nil)
	defer c.close()
	c.start(0)
	c.mustPropose(0, Command{Op: OpAcquire, Lock: "a", Owner: "o", TTL: 60000})
	c.stop(0)

	cfg := c.config(0, c.peers)
	cfg.Group = "another"
	_, err := NewNode(cfg)
	if !errors.Is(err, ErrWrongGroup) {
		t.Fatalf("NewNode on another group's dir = %v, want ErrWrongGroup", err)
	}
	if !strings.Contains(err.Error(), `"test"`) {
		t.Fatalf("error %q does not say which group the dir holds", err)
	}
	// The refusal wrote nothing: the dir still opens for its own group.
	n, err := NewNode(c.config(0, c.peers))
	if err != nil {
		t.Fatalf("reopen for its own group: %v", err)
	}
	if n.applied == 0 {
		t.Fatal("reopened node lost its log")
	}
	_ = n.Stop()
}

func TestNodeThreeNodesAgree(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, nil)
	defer c.close()
	c.startAll()
	c.leader(5 * time.Second)

	const perNode = 60
	type outcome struct {
		id  string
		res Result
	}
	results := make([][]outcome, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			for k := range perNode {
				lock := fmt.Sprintf("lock-%d", k%5)
				cmd := Command{Op: OpAcquire, Lock: lock, Owner: fmt.Sprintf("owner-%d", i), TTL: 600000,
					ID: fmt.Sprintf("n%d-%d", i, k)}
				if k%3 == 2 {
					cmd = Command{Op: OpRelease, Lock: lock, Owner: fmt.Sprintf("owner-%d", i), ID: cmd.ID}
				}
				res, err := c.propose(NodeID(i), cmd, 10*time.Second)
				if err != nil {
					t.Errorf("node %d command %d: %v", i, k, err)
					return
				}
				results[i] = append(results[i], outcome{cmd.ID, res})
			}
		})
	}
	wg.Wait()
	c.converge(5 * time.Second)
	lead := c.leader(time.Second)
	s := waitStatus(t, lead, 5*time.Second, "no lag", func(s NodeStatus) bool {
		for _, m := range s.Members {
			if m.Lag != 0 || m.Match != s.Commit || (m.ID != s.ID && m.LastSeen.IsZero()) {
				return false
			}
		}
		return len(s.Members) == 3
	})
	for _, n := range c.running() {
		if fs := n.Status(); !fs.HasLeader || fs.Leader != s.ID || fs.LeaderAddr != c.peers[s.ID].Addr {
			t.Fatalf("node %d status %+v: want leader %d at %s", fs.ID, fs, s.ID, c.peers[s.ID].Addr)
		}
	}
	stopped := c.stopAndCompare()

	n := 0
	for i := range results {
		for _, o := range results[i] {
			checkAgainstLog(t, stopped[0], o.id, o.res)
			n++
		}
	}
	if n != 3*perNode {
		t.Fatalf("%d results, want %d", n, 3*perNode)
	}
}

// checkAgainstLog checks that the result a proposer got for command id is
// what the log gives: replaying the stopped node's log into a fresh table,
// the first slot holding id answers res.
func checkAgainstLog(t *testing.T, ref *Node, id string, res Result) {
	t.Helper()
	replay := NewTable(0)
	for _, e := range logOf(ref) {
		r := replay.Apply(e.Slot, e.Cmd)
		if e.Cmd.ID != id {
			continue
		}
		if res.Index != e.Slot || !resultsEqual(res, r) {
			t.Fatalf("command %s: proposer got %+v, the log gives %+v at slot %d", id, res, r, e.Slot)
		}
		return
	}
	t.Fatalf("command %s is not in the log", id)
}

// resultsEqual compares two results.
func resultsEqual(a, b Result) bool {
	return a.Code == b.Code && a.Lock == b.Lock && a.Index == b.Index && a.Err == b.Err && slices.Equal(a.Locks, b.Locks)
}
