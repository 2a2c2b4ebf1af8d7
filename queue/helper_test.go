package queue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/queue"
)

const helperEnv = "DROVER_QUEUE_TEST_HELPER"

// runHelper is a worker process for the tests: it runs a queue worker until
// the queue drains or it is killed.
func runHelper(mode string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: strings.Split(os.Getenv("H_ENDPOINTS"), ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: os.Getenv("H_NS"), Queue: "jobs", Concurrency: 32,
		TTL: 2 * time.Second, Drain: true, BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer w.Close(context.Background())
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		if mode == "block" {
			fmt.Printf("STARTED %s\n", t.ID)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		return []byte(t.ID), nil
	})
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("DRAINED %+v\n", w.Stats())
	return 0
}
