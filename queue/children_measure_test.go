package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// TestSpawnTenThousandChildren: one step spawns task.MaxChildren no-op
// children, which all run once, and the next step reads every outcome.
// With DROVER_MEASURE=1 it logs the time from the spawning step's start
// to the next step's start (docs/BENCHMARKS.md); it runs only then, or
// without -short.
func TestSpawnTenThousandChildren(t *testing.T) {
	if testing.Short() && os.Getenv("DROVER_MEASURE") == "" {
		t.Skip("10,000 children: not in -short")
	}
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	n := task.MaxChildren
	f := newFamily(n)
	f.child = func(context.Context, *queue.Task) ([]byte, error) { return nil, nil }
	var mu sync.Mutex
	var spawnAt, nextAt time.Time
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	steps := []task.Step{
		{Name: "fan-out", Run: func(ctx context.Context, _ []byte) ([]byte, error) {
			mu.Lock()
			spawnAt = time.Now()
			mu.Unlock()
			f.count(f.steps, "fan-out")
			return nil, task.Spawn(f.children("p"), task.SpawnOptions{})
		}},
		{Name: "fan-in", Run: func(ctx context.Context, _ []byte) ([]byte, error) {
			mu.Lock()
			nextAt = time.Now()
			mu.Unlock()
			f.count(f.steps, "fan-in")
			out, err := task.Children(ctx)
			if err != nil {
				return nil, err
			}
			return json.Marshal(len(out))
		}},
	}
	setupFamily(t, c, "p")
	parents := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf", Concurrency: 4})
	parents.HandleAll(queue.Steps(store, steps...))
	kids := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "kids", Concurrency: 256, Prefetch: 100})
	kids.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		f.count(f.kids, tk.ID)
		return nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, w := range []*queue.Worker{parents, kids} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != fmt.Sprint(n) {
		t.Fatalf("parent %s with %s (%s)", got.CurrentStatus, got.Result, got.LastError)
	}
	if a, b := f.runs(f.steps, "fan-out"), f.runs(f.steps, "fan-in"); a != 1 || b != 1 {
		t.Fatalf("steps ran %d and %d times; want once each", a, b)
	}
	f.mu.Lock()
	ran, twice := len(f.kids), 0
	for _, k := range f.kids {
		if k != 1 {
			twice++
		}
	}
	f.mu.Unlock()
	if ran != n || twice != 0 {
		t.Fatalf("%d children ran, %d more than once; want %d once each", ran, twice, n)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("fan-out and fan-in of %d no-op children: %s from the spawning step's start to the next step's", n, nextAt.Sub(spawnAt).Round(time.Millisecond))
}
