package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/paxos"
)

// counted is a node that counts the requests its API proposes.
type counted struct {
	*paxos.Node
	proposals atomic.Int64
}

func (c *counted) Propose(ctx context.Context, cmd paxos.Command) (paxos.Result, error) {
	c.proposals.Add(1)
	return c.Node.Propose(ctx, cmd)
}

func (c *counted) AddNode(ctx context.Context, p paxos.Peer) error {
	c.proposals.Add(1)
	return c.Node.AddNode(ctx, p)
}

func (c *counted) RemoveNode(ctx context.Context, id paxos.NodeID) error {
	c.proposals.Add(1)
	return c.Node.RemoveNode(ctx, id)
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// startAPINode starts node 0 of a group whose members are peers (node 0
// first) over the direct transport, serves its API on an httptest server,
// and stops both at the end of the test. With other members that never
// run, the node has no quorum.
func startAPINode(t *testing.T, peers []paxos.Peer, cfg paxos.APIConfig) (*counted, *httptest.Server) {
	t.Helper()
	tr := paxos.NewDirect(paxos.DirectConfig{ID: 0, Group: "client-test"})
	node, err := paxos.NewNode(paxos.Config{ID: 0, Group: "client-test", Peers: peers, Transport: tr, DataDir: t.TempDir(),
		Heartbeat: 10 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := &counted{Node: node}
	cfg.Direct = tr.Handler()
	srv := httptest.NewServer(paxos.NewAPI(c, cfg))
	t.Cleanup(func() {
		srv.Close()
		_ = node.Stop()
		_ = tr.Close()
	})
	return c, srv
}

// singleNode starts a group of one node: it has a quorum by itself.
func singleNode(t *testing.T) (*counted, *httptest.Server) {
	t.Helper()
	return startAPINode(t, []paxos.Peer{{ID: 0}}, paxos.APIConfig{})
}

// startAPIGroup starts a group of n nodes over the direct transport, each
// serving its API (and the transport) on an httptest server whose address
// is the node's peer address, and stops them at the end of the test.
func startAPIGroup(t *testing.T, n int) ([]*counted, []*httptest.Server) {
	t.Helper()
	var srvs []*httptest.Server
	var peers []paxos.Peer
	handlers := make([]http.Handler, n)
	for i := range n {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handlers[i].ServeHTTP(w, r)
		}))
		srvs = append(srvs, srv)
		peers = append(peers, paxos.Peer{ID: paxos.NodeID(i), Addr: srv.Listener.Addr().String()})
	}
	var nodes []*counted
	for i := range n {
		tr := paxos.NewDirect(paxos.DirectConfig{ID: paxos.NodeID(i), Group: "client-test"})
		node, err := paxos.NewNode(paxos.Config{ID: paxos.NodeID(i), Group: "client-test", Peers: peers, Transport: tr, DataDir: t.TempDir(),
			Heartbeat: 20 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := node.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		c := &counted{Node: node}
		handlers[i] = paxos.NewAPI(c, paxos.APIConfig{Direct: tr.Handler()})
		srvs[i].Start()
		nodes = append(nodes, c)
		t.Cleanup(func() {
			srvs[i].Close()
			_ = node.Stop()
			_ = tr.Close()
		})
	}
	return nodes, srvs
}
