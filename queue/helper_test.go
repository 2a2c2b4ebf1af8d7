package queue_test

import (
	"context"
	"testing"

	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"

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
	if strings.HasPrefix(mode, "children-") {
		return runChildHelper(mode)
	}
	if mode == "received" {
		return runReceivedHelper()
	}
	if mode == "otlp-sink" {
		return runSinkHelper()
	}
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
		TTL: ttl, Drain: mode != "waits" && mode != "due-block", BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer w.Close(context.Background())
	if mode == "waits" { // a draining worker would stop once every task waits
		store, _ := task.NewStore(cli, os.Getenv("H_NS"))
		w.HandleAll(queue.Steps(store, waitStepsLogged(os.Getenv("H_LOG"), "victim", os.Getenv("H_BLOCK"))...))
		_ = w.Run(ctx)
		return 0
	}
	if mode == "steps" {
		store, _ := task.NewStore(cli, os.Getenv("H_NS"))
		w.HandleAll(queue.Steps(store, stepsLogged(os.Getenv("H_LOG"), "victim", 30*time.Second)...))
		_ = w.Run(ctx)
		return 0
	}
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		switch mode {
		case "block", "due-block":
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

// succeededIDs returns how many times each task of queue q is recorded as
// SUCCEEDED in what etcd stores: in its segment's outcome batches, and in
// the index of finished tasks with records of their own. A task recorded
// twice shows as 2.
func succeededIDs(t *testing.T, c *queue.Client, cli *clientv3.Client, ns, q string) map[string]int {
	t.Helper()
	ctx := context.Background()
	keys := keyspace.MustNew(ns)
	out := map[string]int{}
	outs, err := cli.Get(ctx, keys.Outs(q, ""), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	perSlot := map[string]int{}
	for _, kv := range outs.Kvs {
		seg, _, _ := keyspace.SegmentPart(keys.Outs(q, ""), string(kv.Key))
		v, err := taskstore.DecodeOut(kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range v.OK {
			perSlot[fmt.Sprintf("%s/%d", seg, s.Slot)]++
		}
	}
	// Name the slots by their task ids, through the listing.
	var after string
	for {
		p, err := c.List(ctx, q, queue.Succeeded, queue.ListOptions{Limit: 1000, After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range p.Tasks {
			out[task.ID] = max(out[task.ID], 1)
		}
		if after = p.Next; after == "" {
			break
		}
	}
	for k, n := range perSlot {
		if n > 1 {
			out["slot "+k] = n
		}
	}
	done, err := cli.Get(ctx, keys.QueueDone(q, "SUCCEEDED"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range done.Kvs {
		if kv.Version != 1 {
			out[string(kv.Key)] = int(kv.Version)
		}
	}
	return out
}
