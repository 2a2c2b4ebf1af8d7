package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// Submitting tasks, running them with a worker until the queue drains, and
// reading a result. Submitting the same tasks again adds nothing; the same
// id with other content is refused with its position.
func Example() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ns := fmt.Sprintf("example-%d", time.Now().UnixNano())
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		fmt.Println(err)
		return
	}
	tasks := []queue.Task{
		{ID: "summarize-1", Type: "summarize", Parameters: json.RawMessage(`{"words":20}`)},
		{ID: "summarize-2", Type: "summarize", Parameters: json.RawMessage(`{"words":50}`)},
	}
	res, err := c.Submit(ctx, "emails", tasks, nil)
	fmt.Printf("submitted %d, duplicates %d, %v\n", res.Submitted, res.Duplicates, err)
	res, _ = c.Submit(ctx, "emails", tasks, nil)
	fmt.Printf("again: submitted %d, duplicates %d\n", res.Submitted, res.Duplicates)
	res, _ = c.Submit(ctx, "emails", []queue.Task{{ID: "summarize-1", Type: "translate"}}, nil)
	fmt.Printf("conflict on line %d\n", res.Rejected[0].Line)

	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "emails", Concurrency: 4, Drain: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Close(ctx)
	w.Handle("summarize", func(ctx context.Context, t *queue.Task) ([]byte, error) {
		// ctx ends on timeout, cancellation or a lost claim: pass it to
		// the LLM call.
		var p struct{ Words int }
		if err := json.Unmarshal(t.Parameters, &p); err != nil {
			return nil, queue.Permanent(err) // retrying cannot fix it
		}
		return []byte(fmt.Sprintf("a summary in %d words", p.Words)), nil
	})
	if err := w.Run(ctx); err != nil { // until the queue is drained
		fmt.Println(err)
		return
	}
	t, _ := c.Wait(ctx, "summarize-2")
	fmt.Printf("%s: %s, %q\n", t.ID, t.CurrentStatus, t.Result)
	st, _ := c.Stats(ctx, "emails")
	fmt.Printf("succeeded %d\n", st.Succeeded)
	// Output:
	// submitted 2, duplicates 0, <nil>
	// again: submitted 0, duplicates 2
	// conflict on line 1
	// summarize-2: SUCCEEDED, "a summary in 50 words"
	// succeeded 2
}

// A task that runs later: SCHEDULED until its delay has passed, then
// claimed as any other.
func ExampleTask_delay() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ns := fmt.Sprintf("example-delay-%d", time.Now().UnixNano())
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		fmt.Println(err)
		return
	}
	submitted := time.Now()
	_, err = c.Submit(ctx, "builds", []queue.Task{{ID: "check-981", Type: "check", Delay: queue.Duration(500 * time.Millisecond)}}, nil)
	st, _ := c.Stats(ctx, "builds")
	fmt.Printf("scheduled %d, pending %d, %v\n", st.Scheduled, st.Pending, err)

	// Not Drain: a draining worker does not wait for tasks scheduled later.
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "builds"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Close(ctx)
	w.Handle("check", func(ctx context.Context, t *queue.Task) ([]byte, error) {
		fmt.Println("ran after its delay:", time.Since(submitted) >= 500*time.Millisecond)
		return nil, nil
	})
	go func() { // the worker stops once the task has run
		_, _ = c.Wait(ctx, "check-981")
		_ = w.Stop(ctx)
	}()
	if err := w.Run(ctx); err != nil {
		fmt.Println(err)
	}
	// Output:
	// scheduled 1, pending 0, <nil>
	// ran after its delay: true
}

// Human approval: a step drafts a plan and waits for the signal
// "approval"; the task is parked WAITING, holding no worker slot, until a
// reviewer sends it; the next step gets the reviewer's answer.
func ExampleClient_Signal() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ns := fmt.Sprintf("example-signal-%d", time.Now().UnixNano())
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		fmt.Println(err)
		return
	}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		fmt.Println(err)
		return
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "agents"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Close(ctx)
	w.HandleAll(queue.Steps(store,
		task.Step{Name: "plan", Run: func(ctx context.Context, _ []byte) ([]byte, error) {
			return []byte("delete 3 stale branches"), task.WaitSignal("approval", 24*time.Hour)
		}},
		task.Step{Name: "act", Run: func(ctx context.Context, plan []byte) ([]byte, error) {
			sg, _ := task.ReceivedSignal(ctx)
			var answer struct{ Approved bool }
			if sg.TimedOut || json.Unmarshal(sg.Data, &answer) != nil || !answer.Approved {
				return []byte("not done: " + string(plan)), nil
			}
			return []byte("done: " + string(plan)), nil
		}},
	))
	go func() { _ = w.Run(ctx) }()
	defer w.Stop(ctx)

	_, _ = c.Submit(ctx, "agents", []queue.Task{{ID: "cleanup-7", Type: "agent"}}, nil)
	for t, _ := c.Get(ctx, "cleanup-7"); t == nil || t.CurrentStatus != queue.Waiting; t, _ = c.Get(ctx, "cleanup-7") {
		time.Sleep(10 * time.Millisecond)
	}
	t, _ := c.Get(ctx, "cleanup-7")
	fmt.Println(t.CurrentStatus, "for", t.WaitingFor.Signals)

	res, err := c.Signal(ctx, "cleanup-7", "approval", json.RawMessage(`{"approved":true}`), "review-1")
	fmt.Printf("stored %t, woke %t, %v\n", res.Stored, res.Woke, err)
	t, _ = c.Wait(ctx, "cleanup-7")
	fmt.Printf("%s: %s\n", t.CurrentStatus, t.Result)
	// Output:
	// WAITING for [approval]
	// stored true, woke true, <nil>
	// SUCCEEDED: done: delete 3 stale branches
}
