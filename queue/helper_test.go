package queue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// stepsLogged returns three agent steps that log "worker step" to logPath
// when they start and append their name to the state; the second takes
// slow.
func stepsLogged(logPath, worker string, slow time.Duration) []task.Step {
	var steps []task.Step
	for i, name := range []string{"s1", "s2", "s3"} {
		steps = append(steps, task.Step{Name: name, Run: func(ctx context.Context, state []byte) ([]byte, error) {
			f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(f, "%s %s\n", worker, name)
			f.Close()
			if i == 1 {
				select {
				case <-time.After(slow):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return append(append([]byte{}, state...), "|"+name...), nil
		}})
	}
	return steps
}

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
	conc := 32
	if v, err := strconv.Atoi(os.Getenv("H_CONCURRENCY")); err == nil {
		conc = v
	}
	ttl := 2 * time.Second
	if v, err := time.ParseDuration(os.Getenv("H_TTL")); err == nil {
		ttl = v
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: os.Getenv("H_NS"), Queue: "jobs", Concurrency: conc,
		TTL: ttl, Drain: true, BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer w.Close(context.Background())
	if mode == "steps" {
		store, _ := task.NewStore(cli, os.Getenv("H_NS"))
		w.HandleAll(queue.Steps(store, stepsLogged(os.Getenv("H_LOG"), "victim", 30*time.Second)...))
		_ = w.Run(ctx)
		return 0
	}
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		switch mode {
		case "block":
			fmt.Printf("STARTED %s\n", t.ID)
			<-ctx.Done()
			return nil, ctx.Err()
		case "slow": // a start log line per attempt, then 50 ms of work
			fmt.Printf("START %s %d %d\n", t.ID, t.Attempt, time.Now().UnixNano())
			time.Sleep(50 * time.Millisecond)
			fmt.Printf("END %s %d\n", t.ID, t.Attempt)
			return []byte(t.ID), nil
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
