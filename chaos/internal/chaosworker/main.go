// Command chaosworker is the queue worker of the chaos tests: a
// queue.Worker whose handler logs every attempt it runs, so that the tests
// can tell which attempts ran where and which of them etcd acknowledged.
//
// For each attempt it appends "S task attempt pid unix-ns" to -log when the
// attempt starts and "E task attempt pid unix-ns" once its work (a sleep of
// -task-time) is done, and returns "task attempt pid" as the result. The
// work ignores the handler's context on purpose: a worker paused past its
// TTL finishes it when it runs again and tries to acknowledge it late, as a
// handler that does not watch its context would.
//
// It stops on SIGTERM, prints its counts (queue.WorkerStats) as JSON and
// exits 0; it exits 70 when it lost its lease.
//
//	chaosworker -endpoints 127.0.0.1:2379 -queue chaos -log attempts.log
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func main() { os.Exit(run()) }

func run() int {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "etcd endpoints, comma-separated")
	q := flag.String("queue", "chaos", "queue to work")
	logPath := flag.String("log", "attempts.log", "file the attempts are appended to")
	ttl := flag.Duration("ttl", 2*time.Second, "lease TTL")
	conc := flag.Int("concurrency", 4, "tasks run at once")
	prefetch := flag.Int("prefetch", 0, "most tasks claimed at once (0: the worker's default)")
	work := flag.Duration("task-time", 100*time.Millisecond, "how long each attempt works")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log, err := os.OpenFile(*logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer log.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Queue: *q, Concurrency: *conc, Prefetch: *prefetch, TTL: *ttl,
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second, ShutdownTimeout: 5 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pid := os.Getpid()
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		// One write per line: O_APPEND keeps lines of all workers whole.
		fmt.Fprintf(log, "S %s %d %d %d\n", t.ID, t.Attempt, pid, time.Now().UnixNano())
		time.Sleep(*work)
		fmt.Fprintf(log, "E %s %d %d %d\n", t.ID, t.Attempt, pid, time.Now().UnixNano())
		return fmt.Appendf(nil, "%s %d %d", t.ID, t.Attempt, pid), nil
	})
	runErr := w.Run(ctx)
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.Close(cctx)
	_ = json.NewEncoder(os.Stdout).Encode(w.Stats())
	switch {
	case errors.Is(runErr, lease.ErrLost):
		fmt.Fprintln(os.Stderr, "chaosworker:", runErr)
		return 70
	case runErr != nil:
		fmt.Fprintln(os.Stderr, "chaosworker:", runErr)
		return 1
	}
	return 0
}
