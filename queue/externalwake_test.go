package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// A session that claimed and acked tasks one at a time, round after round,
// with a task of each round left running: a waiting claim is woken by the
// next submission and takes it at once, every round.
func TestExternalClaimWokenEveryRound(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	l := grantLease(t, cli, 30*time.Second)
	q := "rounds"
	for round := 0; round < 6; round++ {
		ids := []string{fmt.Sprintf("r%d-1", round), fmt.Sprintf("r%d-2", round)}
		if _, err := c.Submit(ctx, q, []queue.Task{{ID: ids[0], Type: "t"}, {ID: ids[1], Type: "t"}}, nil); err != nil {
			t.Fatal(err)
		}
		for range ids {
			got, err := c.Claim(ctx, q, queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
			if err != nil || len(got) != 1 {
				t.Fatalf("round %d: claimed %d, %v", round, len(got), err)
			}
			if _, err := c.Ack(ctx, held(q, got[0], l), nil); err != nil {
				t.Fatal(err)
			}
		}
		third := fmt.Sprintf("r%d-3", round)
		go func() {
			time.Sleep(time.Second)
			_, _ = c.Submit(ctx, q, []queue.Task{{ID: third, Type: "t"}}, nil)
		}()
		began := time.Now()
		got, err := c.Claim(ctx, q, queue.ClaimRequest{Lease: l, Worker: "w", Max: 1, Wait: 4 * time.Second})
		took := time.Since(began)
		if err != nil || len(got) != 1 || got[0].ID != third {
			t.Fatalf("round %d: the waiting claim got %v (%v) after %v; want %s", round, got, err, took, third)
		}
		if took > 2500*time.Millisecond {
			t.Fatalf("round %d: the waiting claim took %v; want it woken by the submission at 1 s", round, took)
		}
		// The third stays running under the session.
	}
}

// A worker whose oldest open segment is kept open by a long task still
// runs tasks submitted seconds later at once (its reads of the open
// segments start at the oldest; the claim it makes when woken must reach
// the new one). The external claim's test above is the one that failed
// before reads past the window's end; this one keeps the worker's side.
func TestWorkerSeesNewSegmentsBehindALongTask(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	q := "behind"
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	started, release := make(chan string, 16), make(chan struct{})
	w.HandleAll(func(hctx context.Context, tk *queue.Task) ([]byte, error) {
		started <- tk.ID
		if tk.ID == "long" {
			<-release
		}
		return nil, nil
	})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	if _, err := c.Submit(ctx, q, []queue.Task{{ID: "long", Type: "t"}}, nil); err != nil {
		t.Fatal(err)
	}
	if id := <-started; id != "long" {
		t.Fatalf("started %s first", id)
	}
	for i := 0; i < 3; i++ {
		time.Sleep(1500 * time.Millisecond) // past the window's first width (1 s)
		id := fmt.Sprintf("new-%d", i)
		began := time.Now()
		if _, err := c.Submit(ctx, q, []queue.Task{{ID: id, Type: "t"}}, nil); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-started:
			if got != id {
				t.Fatalf("started %s, want %s", got, id)
			}
			if took := time.Since(began); took > time.Second {
				t.Fatalf("%s started %v after its submission", id, took)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not start within 5 s of its submission", id)
		}
	}
	close(release)
	cancel()
	<-done
}

// TestWaitingClaimsLineUp: 16 sessions' claims wait on an empty queue, and
// tasks come one at a time. Each task is claimed by one of them, and the
// others do not all claim for it: the claims that wait line up behind one
// that claims for the queue (the line), so the store sees a few claims per
// task, not one per waiting session (which made 16 or more per task).
func TestWaitingClaimsLineUp(t *testing.T) {
	const sessions, tasks = 16, 30
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, cli := newClient(t, etcdtest.Namespace(t))
	q := "line"
	got := make(chan string, tasks)
	done := make(chan struct{})
	for s := 0; s < sessions; s++ {
		l := grantLease(t, cli, 30*time.Second)
		go func() {
			defer func() { done <- struct{}{} }()
			for ctx.Err() == nil {
				ts, err := c.Claim(ctx, q, queue.ClaimRequest{Lease: l, Worker: fmt.Sprint("s", s), Max: 8, Wait: 2 * time.Second})
				if err != nil {
					return
				}
				for _, tk := range ts {
					got <- tk.ID
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // all of them waiting
	before := queue.ClaimAttempts(c)
	for i := 0; i < tasks; i++ {
		id := fmt.Sprintf("t%d", i)
		if _, err := c.Submit(ctx, q, []queue.Task{{ID: id, Type: "t"}}, nil); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-got:
			if g != id {
				t.Fatalf("claimed %s, want %s", g, id)
			}
		case <-time.After(25 * time.Second): // a bound against a hang, under the leases' 30 s
			t.Fatalf("task %s not claimed within 25 s of its submission", id)
		}
	}
	per := float64(queue.ClaimAttempts(c)-before) / tasks
	cancel()
	for s := 0; s < sessions; s++ {
		<-done
	}
	t.Logf("%.1f claims of the store per task with %d sessions waiting", per, sessions)
	if per > 4 {
		t.Fatalf("%.1f claims of the store per task; want at most 4 with the waiting claims lined up", per)
	}
}
