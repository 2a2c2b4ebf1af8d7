package paxos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestConfigApply(t *testing.T) {
	c := newConfig([]Peer{{ID: 2}, {ID: 0}, {ID: 1}})
	if got := c.peerList(); !slices.Equal(got, []Peer{{ID: 0}, {ID: 1}, {ID: 2}}) || c.quorum() != 2 {
		t.Fatalf("config %v quorum %d", got, c.quorum())
	}
	cases := []struct {
		name    string
		cmd     Command
		members int
		why     string
	}{
		{name: "add", cmd: Command{Op: OpAddNode, Node: 3, Addr: "127.0.0.1:1"}, members: 4},
		{name: "add a member", cmd: Command{Op: OpAddNode, Node: 1}, members: 3, why: "already a member"},
		{name: "remove", cmd: Command{Op: OpRemoveNode, Node: 1}, members: 2},
		{name: "remove a non-member", cmd: Command{Op: OpRemoveNode, Node: 9}, members: 3, why: "not a member"},
		{name: "not a change", cmd: Command{Op: OpAcquire}, members: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next, why := c.apply(tc.cmd)
			if len(next.peers) != tc.members || (tc.why == "") != (why == "") || (tc.why != "" && !containsStr(why, tc.why)) {
				t.Fatalf("apply %+v = %v, %q", tc.cmd, next.peers, why)
			}
			if len(c.peers) != 3 {
				t.Fatal("apply changed the original configuration")
			}
		})
	}
	one := newConfig([]Peer{{ID: 5}})
	if _, why := one.apply(Command{Op: OpRemoveNode, Node: 5}); why == "" {
		t.Fatal("removing the last member was allowed")
	}
	// Majorities of consecutive configurations intersect.
	for size := 1; size <= 6; size++ {
		var ps []Peer
		for i := range size {
			ps = append(ps, Peer{ID: NodeID(i)})
		}
		old := newConfig(ps)
		grown, _ := old.apply(Command{Op: OpAddNode, Node: NodeID(size)})
		if old.quorum()+grown.quorum() <= len(grown.peers) {
			t.Fatalf("size %d: majorities of %d and %d nodes may not intersect", size, size, size+1)
		}
	}
}

func containsStr(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// waitStatus waits until node n's status satisfies ok.
func waitStatus(t *testing.T, n *Node, within time.Duration, what string, ok func(NodeStatus) bool) NodeStatus {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := n.Status()
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d: %s not reached within %s: %+v", s.ID, what, within, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func memberIDs(s NodeStatus) []NodeID {
	var ids []NodeID
	for _, m := range s.Members {
		ids = append(ids, m.ID)
	}
	return ids
}

func TestNodeMembershipGrowAndShrinkUnderLoad(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 5, func(cfg *Config) { cfg.SnapshotEvery = 200 })
	defer c.close()
	founders := c.peers[:3]
	for _, p := range founders {
		c.startWith(p.ID, founders)
	}
	lead := c.leader(5 * time.Second).cfg.ID
	var stay []NodeID // founders that stay members throughout
	for _, p := range founders {
		if p.ID != lead {
			stay = append(stay, p.ID)
		}
	}
	held := c.mustPropose(stay[0], Command{Op: OpAcquire, Lock: "held", Owner: "keeper", TTL: 600000})

	// Clients keep taking and freeing locks throughout.
	load := startLoad(t, c, stay, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	load.more(t, "before the changes")

	// 3 -> 5: each new node starts knowing the current members, is added
	// through the log, catches up and becomes a voting member.
	members := slices.Clone(founders)
	for _, p := range c.peers[3:] {
		n := c.startWith(p.ID, members)
		if s := n.Status(); s.Role != "follower" {
			t.Fatalf("joining node %d is %s before it is added", p.ID, s.Role)
		}
		if err := c.node(stay[1]).AddNode(ctx, p); err != nil {
			t.Fatalf("add node %d: %v", p.ID, err)
		}
		members = append(members, p)
		waitStatus(t, n, 10*time.Second, "member", func(s NodeStatus) bool { return len(s.Members) == len(members) })
		load.more(t, fmt.Sprintf("after adding %d", p.ID))
	}
	for _, n := range c.running() {
		waitStatus(t, n, 10*time.Second, "5 members", func(s NodeStatus) bool { return len(s.Members) == 5 })
	}
	if err := c.node(stay[0]).AddNode(ctx, c.peers[3]); err == nil || !containsStr(err.Error(), "already a member") {
		t.Fatalf("adding a member again = %v, want a rejection", err)
	}

	// 5 -> 3: remove the leader of the start and node 3.
	for _, id := range []NodeID{lead, 3} {
		if err := c.node(stay[0]).RemoveNode(ctx, id); err != nil {
			t.Fatalf("remove node %d: %v", id, err)
		}
		waitStatus(t, c.node(id), 10*time.Second, "removed", func(s NodeStatus) bool { return s.Role == "removed" })
		load.more(t, fmt.Sprintf("after removing %d", id))
	}
	final := []NodeID{stay[0], stay[1], 4}
	for _, id := range final {
		s := waitStatus(t, c.node(id), 10*time.Second, "3 members", func(s NodeStatus) bool { return len(s.Members) == 3 })
		if !slices.Equal(memberIDs(s), sortedIDs(final)) {
			t.Fatalf("node %d members %v, want %v", id, memberIDs(s), final)
		}
	}
	load.halt()
	if t.Failed() {
		return
	}
	t.Logf("%d acquire/release cycles during 3 -> 5 -> 3", load.cycles.Load())
	load.grants.checkTokens(t)
	get := c.mustPropose(4, Command{Op: OpGet, Lock: "held"})
	if get.Code != CodeOK || get.Lock.Token != held.Lock.Token || get.Lock.Owner != "keeper" {
		t.Fatalf("the lock held before the changes is now %+v", get)
	}
	if _, err := c.propose(lead, Command{Op: OpGet, Lock: "held"}, time.Second); !errors.Is(err, ErrRemoved) {
		t.Fatalf("Propose on a removed node = %v, want ErrRemoved", err)
	}

	checkRemovedDoNotVote(t, c, final, []NodeID{lead, 3})
}

// loadGen is clients that take and free a lock each, in a loop, at the
// given nodes; any failure fails the test.
type loadGen struct {
	cycles atomic.Int64
	grants grantLog
	stop   atomic.Bool
	wg     sync.WaitGroup
}

func startLoad(t *testing.T, c *testCluster, at []NodeID, clients int) *loadGen {
	l := &loadGen{}
	for cl := range clients {
		l.wg.Go(func() {
			lock := fmt.Sprintf("load-%d", cl)
			for k := 0; !l.stop.Load() && k < 100000; k++ {
				node := at[(cl+k)%len(at)]
				acq, err := c.propose(node, Command{Op: OpAcquire, Lock: lock, Owner: "loader", TTL: 600000}, 10*time.Second)
				if err != nil || acq.Code != CodeOK {
					t.Errorf("load acquire %d at node %d: %+v %v", k, node, acq, err)
					return
				}
				l.grants.add(acq.Lock)
				rel, err := c.propose(node, Command{Op: OpRelease, Lock: lock, Owner: "loader", Token: acq.Lock.Token}, 10*time.Second)
				if err != nil || rel.Code != CodeOK {
					t.Errorf("load release %d at node %d: %+v %v", k, node, rel, err)
					return
				}
				l.cycles.Add(1)
			}
		})
	}
	return l
}

// more waits until the clients have completed a few more cycles, so that
// what the test does next happens amid the load.
func (l *loadGen) more(t *testing.T, what string) {
	t.Helper()
	want := l.cycles.Load() + 8
	for deadline := time.Now().Add(10 * time.Second); l.cycles.Load() < want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) || t.Failed() {
			t.Fatalf("%s: the load made no progress (%d cycles)", what, l.cycles.Load())
		}
	}
}

// halt stops the clients and waits for them.
func (l *loadGen) halt() {
	l.stop.Store(true)
	l.wg.Wait()
}

func sortedIDs(ids []NodeID) []NodeID {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// checkRemovedDoNotVote: the removed nodes (still running) answer no
// Prepare, and their votes are not counted: with two of the three members
// down nothing commits although a majority of the old five runs; with the
// removed nodes stopped and two members up, the group commits.
func checkRemovedDoNotVote(t *testing.T, c *testCluster, final, removed []NodeID) {
	t.Helper()
	a, b, d := final[0], final[1], final[2]
	c.stop(b)
	c.stop(d)

	// Drive d's endpoint by hand: d is a member, so a Prepare from it is
	// answered by member a, and ignored by a removed node.
	fake := c.net.Transport(d)
	high := Ballot{Round: 1 << 40, Node: d}
	for _, to := range append([]NodeID{a}, removed...) {
		if err := fake.Send(Message{Type: MsgPrepare, Group: "test", To: to, Ballot: high, Slot: 1}); err != nil {
			t.Fatal(err)
		}
	}
	promisedBy := map[NodeID]bool{}
	for deadline := time.After(300 * time.Millisecond); ; {
		select {
		case m := <-fake.Recv():
			if m.Type == MsgPromise {
				promisedBy[m.From] = true
			}
			continue
		case <-deadline:
		}
		break
	}
	if !promisedBy[a] || promisedBy[removed[0]] || promisedBy[removed[1]] {
		t.Fatalf("promises from %v: want one from member %d and none from removed %v", promisedBy, a, removed)
	}
	_ = fake.Close()

	if _, err := c.propose(a, Command{Op: OpGet, Lock: "held"}, 700*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("with 1 of 3 members up (and 2 removed nodes running) Propose = %v, want ErrTimeout", err)
	}
	for _, id := range removed {
		if s := c.node(id).Status(); s.Role != "removed" {
			t.Fatalf("removed node %d is %s", id, s.Role)
		}
		c.stop(id)
	}
	c.start(b)
	if res := c.mustPropose(a, Command{Op: OpGet, Lock: "held"}); res.Code != CodeOK {
		t.Fatalf("with 2 of 3 members up: %+v", res)
	}
	c.start(d)
	c.converge(10 * time.Second)
	c.stopAndCompare()
}
