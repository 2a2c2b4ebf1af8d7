package paxos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// directNodes is a group of real nodes over the direct transport on
// 127.0.0.1, each serving its REST API and peer streams on its address.
type directNodes struct {
	t     *testing.T
	peers []Peer
	nodes []*Node
	trs   []*DirectTransport
	srvs  []*http.Server
	done  []chan struct{}
}

// startDirectNodes starts size founding members, ids 0..size-1.
func startDirectNodes(t *testing.T, group string, size int) *directNodes {
	t.Helper()
	g := &directNodes{t: t}
	var lns []net.Listener
	for i := range size {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		g.peers = append(g.peers, Peer{ID: NodeID(i), Addr: ln.Addr().String()})
	}
	for i, ln := range lns {
		tr := NewDirect(DirectConfig{ID: NodeID(i), Group: group, Logger: testLogger()})
		n, err := NewNode(Config{ID: NodeID(i), Group: group, Peers: g.peers, Transport: tr, DataDir: t.TempDir(),
			Heartbeat: 10 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: NewAPI(n, APIConfig{Direct: tr.Handler(), RequestTimeout: time.Second}), ReadHeaderTimeout: 5 * time.Second}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = srv.Serve(ln)
		}()
		g.nodes, g.trs, g.srvs, g.done = append(g.nodes, n), append(g.trs, tr), append(g.srvs, srv), append(g.done, done)
	}
	return g
}

// close stops every node: the transport first (it owns the hijacked
// streams), then the server and the node.
func (g *directNodes) close() {
	for i := range g.nodes {
		_ = g.trs[i].Close()
		_ = g.srvs[i].Close()
		<-g.done[i]
		_ = g.nodes[i].Stop()
	}
}

// leader waits for a node that reports itself leader.
func (g *directNodes) leader(within time.Duration) *Node {
	g.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, n := range g.nodes {
			if n.Status().Role == "leader" {
				return n
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	g.t.Fatalf("no leader within %s", within)
	return nil
}

// TestDirectRemovedFollowerLearnsItsRemoval: over the direct transport
// the members drop a removed node from their peer lists, so unless they
// keep its address nothing reaches it: it never learns it was removed,
// campaigns with ever higher ballots, and its clients get 504 instead of
// the 503 that sends them to another node. It must learn (from a member's
// answer to its Prepare, and a catch-up), while no member ever promises
// it anything.
func TestDirectRemovedFollowerLearnsItsRemoval(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g := startDirectNodes(t, "removed-direct", 3)
	defer g.close()
	lead := g.leader(5 * time.Second)
	var x *Node
	for _, n := range g.nodes {
		if n != lead {
			x = n
			break
		}
	}
	id := x.cfg.ID
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lead.RemoveNode(ctx, id); err != nil {
		t.Fatalf("remove %d: %v", id, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for x.Status().Role != "removed" {
		if time.Now().After(deadline) {
			t.Fatalf("node %d never learned its removal over the direct transport: %+v", id, x.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Its clients are sent elsewhere at once.
	addr := g.peers[id].Addr
	resp, err := http.Post("http://"+addr+"/locks/a", "application/json", strings.NewReader(`{"owner":"o","ttl":30}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a request to the removed node: %d, want 503", resp.StatusCode)
	}
	// The members never promised the removed node anything, and still
	// choose without it.
	time.Sleep(300 * time.Millisecond)
	for _, n := range g.nodes {
		if n == x {
			continue
		}
		if s := n.Status(); s.Ballot.Node == id {
			t.Errorf("member %d promised ballot %s of the removed node %d", n.cfg.ID, s.Ballot, id)
		}
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer pcancel()
	for _, n := range g.nodes {
		if n == x {
			continue
		}
		if res, err := n.Propose(pctx, Command{Op: OpAcquire, Lock: fmt.Sprint("after-", n.cfg.ID), Owner: "o", TTL: 60000}); err != nil || res.Code != CodeOK {
			t.Fatalf("acquire at member %d after the removal: %+v, %v", n.cfg.ID, res, err)
		}
	}
}

// TestDirectReachesAPeerThatLeft: a peer dropped by SetPeers is still
// reached at its last address (a removed node must hear the members'
// answers); a node never listed has no address.
func TestDirectReachesAPeerThatLeft(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	nodes, _, ids := directTestGroup(t, "left", 2)
	defer func() {
		for _, n := range nodes {
			n.stop()
		}
	}()
	a, b := nodes[0], nodes[1]
	a.tr.SetPeers([]Peer{{ID: ids[0], Addr: a.addr}}) // b left the configuration
	if err := a.tr.Send(Message{Type: MsgNack, To: ids[1], Commit: 7}); err != nil {
		t.Fatalf("send to a peer that left: %v", err)
	}
	m, ok := xportRecvOne(b.tr, 5*time.Second)
	if !ok || m.Commit != 7 || m.To != ids[1] {
		t.Fatalf("the peer that left got %+v, %v", m, ok)
	}
	if err := a.tr.Send(Message{Type: MsgNack, To: 99}); err == nil || !strings.Contains(err.Error(), "no address for node 99") {
		t.Fatalf("send to a node never listed: %v", err)
	}
}
