// Package paxostest runs a group of drover's Paxos lock service nodes inside
// a test process: each node on the direct transport over loopback, serving
// the REST API, with its acceptor state in a TempDir. Tests of code that
// takes locks through paxoslock.Locker use it as they use servicetest's Redis.
package paxostest

import (
	"github.com/droverhq/drover/paxos/client"

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

// waitReady waits up to 10 s until the group grants and releases a lock,
// trying again every 50 ms.
func (g *Group) waitReady(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.New(client.Config{Endpoints: g.Endpoints})
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = c.Close(ctx) }()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		li, err := c.Acquire(actx, "paxostest-ready", client.AcquireRequest{Owner: "ready", TTL: time.Second})
		if err == nil {
			err = c.Release(actx, "paxostest-ready", "ready", li.Token)
		}
		acancel()
		if err == nil {
			return
		}
		retry.Reset(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			tb.Fatalf("paxos group not ready after 10s: %v", err)
		case <-retry.C:
		}
	}
}
