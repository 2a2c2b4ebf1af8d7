package paxos

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs the package's tests, or, when the test binary is started
// with DROVER_PAXOS_TEST_NODE=1, one node process: tests crash such nodes
// with SIGKILL, which an in-process node cannot get.
func TestMain(m *testing.M) {
	if os.Getenv("DROVER_PAXOS_TEST_NODE") == "1" {
		os.Exit(runTestNode())
	}
	os.Exit(m.Run())
}

// runTestNode serves one node over RabbitMQ until SIGTERM (or SIGKILL).
// Environment: NODE_ID, NODE_PEERS (comma-separated ids), NODE_GROUP,
// NODE_DATA, NODE_AMQP. It prints "listening ADDR" once it serves.
func runTestNode() int {
	id, _ := strconv.ParseUint(os.Getenv("NODE_ID"), 10, 64)
	var peers []Peer
	for _, p := range strings.Split(os.Getenv("NODE_PEERS"), ",") {
		n, _ := strconv.ParseUint(p, 10, 64)
		peers = append(peers, Peer{ID: NodeID(n)})
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	tr, err := DialAMQP(dctx, AMQPConfig{URL: os.Getenv("NODE_AMQP"), Group: os.Getenv("NODE_GROUP"), ID: NodeID(id), Logger: log})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 69
	}
	defer tr.Close()
	node, err := NewNode(Config{ID: NodeID(id), Group: os.Getenv("NODE_GROUP"), Peers: peers, Transport: tr,
		DataDir: os.Getenv("NODE_DATA"), Logger: log, SnapshotEvery: 1000})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := node.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer node.Stop()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := &http.Server{Handler: NewAPI(node, APIConfig{RequestTimeout: 3 * time.Second, Logger: log})}
	go func() { _ = srv.Serve(l) }()
	fmt.Printf("listening %s\n", l.Addr())
	<-ctx.Done()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	return 0
}
