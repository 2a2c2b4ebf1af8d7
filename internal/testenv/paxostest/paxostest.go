// Package paxostest runs a group of drover's Paxos lock service nodes inside
// a test process: each node on the direct transport over loopback, serving
// the REST API, with its acceptor state in a TempDir. Tests of code that
// takes locks through lock.Paxos use it as they use servicetest's Redis.
package paxostest

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/paxos"
)

// Group is a running group of Paxos nodes.
type Group struct {
	// Endpoints are the nodes' API addresses, host:port.
	Endpoints []string
	stop      []func()
}

// Start starts a group of n nodes, waits until it grants a lock, and stops
// it when the test ends.
func Start(tb testing.TB, n int) *Group {
	tb.Helper()
	var lns []net.Listener
	var peers []paxos.Peer
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		lns = append(lns, ln)
		peers = append(peers, paxos.Peer{ID: paxos.NodeID(i), Addr: ln.Addr().String()})
	}
	g := &Group{}
	tb.Cleanup(g.Stop)
	for i, ln := range lns {
		tr := paxos.NewDirect(paxos.DirectConfig{ID: paxos.NodeID(i), Group: "paxostest"})
		node, err := paxos.NewNode(paxos.Config{ID: paxos.NodeID(i), Group: "paxostest", Peers: peers, Transport: tr,
			DataDir: tb.TempDir(), Heartbeat: 20 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond})
		if err != nil {
			tb.Fatal(err)
		}
		if err := node.Start(context.Background()); err != nil {
			tb.Fatal(err)
		}
		srv := &http.Server{Handler: paxos.NewAPI(node, paxos.APIConfig{Direct: tr.Handler(), RequestTimeout: 2 * time.Second}), ReadHeaderTimeout: 5 * time.Second}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = srv.Serve(ln)
		}()
		g.Endpoints = append(g.Endpoints, ln.Addr().String())
		g.stop = append(g.stop, func() {
			_ = srv.Close()
			<-done
			_ = node.Stop()
			_ = tr.Close()
		})
	}
	g.waitReady(tb)
	return g
}

// URL is the group as a --lock-backend value: paxos://HOST:PORT,....
func (g *Group) URL() string { return "paxos://" + strings.Join(g.Endpoints, ",") }

// Stop stops every node; calling it again does nothing.
func (g *Group) Stop() {
	for _, stop := range g.stop {
		stop()
	}
	g.stop = nil
}

// waitReady waits up to 10 s until the group grants and releases a lock.
func (g *Group) waitReady(tb testing.TB) {
	tb.Helper()
	c, err := paxos.NewClient(paxos.ClientConfig{Endpoints: g.Endpoints})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		li, err := c.Acquire(ctx, "paxostest-ready", paxos.AcquireRequest{Owner: "ready", TTL: time.Second})
		if err == nil {
			err = c.Release(ctx, "paxostest-ready", "ready", li.Token)
		}
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("paxos group not ready after 10s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
