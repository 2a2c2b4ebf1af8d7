package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestQueueDirectoryAndDelete: submitted and configured queues are listed;
// a name never used does not exist; deleting a queue removes every task and
// key of it, and refuses while a task runs.
func TestQueueDirectoryAndDelete(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	if _, err := c.Submit(ctx, "mail", tasksN("m", 130), nil); err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(ctx, "empty", queue.Config{MaxDepth: 5}); err != nil {
		t.Fatal(err)
	}
	qs, err := c.Queues(ctx)
	if err != nil || len(qs) != 2 || qs[0].Name != "empty" || qs[0].Config.MaxDepth != 5 || qs[1].Name != "mail" || qs[1].Stats.Pending != 130 {
		t.Fatalf("queues: %+v, %v", qs, err)
	}
	for q, want := range map[string]bool{"mail": true, "empty": true, "mial": false} {
		if ok, err := c.Exists(ctx, q); err != nil || ok != want {
			t.Fatalf("exists %s: %t, %v", q, ok, err)
		}
	}
	if _, err := c.DeleteQueue(ctx, "mial", nil); !errors.Is(err, queue.ErrNoQueue) {
		t.Fatalf("delete of a queue never used: %v", err)
	}
	// A running task blocks the deletion.
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "mail", Concurrency: 1})
	started, release := make(chan struct{}, 1), make(chan struct{})
	w.HandleAll(func(ctx context.Context, _ *queue.Task) ([]byte, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		return nil, nil
	})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	<-started
	if _, err := c.DeleteQueue(ctx, "mail", nil); !errors.Is(err, queue.ErrQueueBusy) {
		t.Fatalf("delete while running: %v", err)
	}
	stop()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	n, err := c.DeleteQueue(ctx, "mail", nil)
	if err != nil || n != 130 {
		t.Fatalf("delete: %d, %v", n, err)
	}
	for _, p := range []string{"/" + ns + "/queues/mail/", "/" + ns + "/tasks/m-", "/" + ns + "/queue-names/mail"} {
		if g, err := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || g.Count != 0 {
			t.Fatalf("%d keys left under %s (%v)", g.Count, p, err)
		}
	}
	if qs, _ := c.Queues(ctx); len(qs) != 1 {
		t.Fatalf("queues after delete: %+v", qs)
	}
}

// TestWait: Wait returns when the task finishes, without polling, and with
// ctx's error while it has not.
func TestWait(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	if _, err := c.Submit(ctx, "w", []queue.Task{{ID: "slow", Type: "t"}, {ID: "gone", Type: "t"}}, nil); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if got, err := c.Wait(short, "slow"); !errors.Is(err, context.DeadlineExceeded) || got == nil || got.CurrentStatus != queue.Pending {
		t.Fatalf("wait on a pending task: %+v, %v", got, err)
	}
	waited := make(chan *queue.Task, 1)
	go func() {
		got, err := c.Wait(ctx, "slow")
		if err != nil {
			t.Error(err)
		}
		waited <- got
	}()
	if _, err := c.Cancel(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Wait(ctx, "gone"); err != nil || got.CurrentStatus != queue.Cancelled {
		t.Fatalf("wait on a cancelled task: %+v, %v", got, err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "w", Drain: true})
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return []byte(`{"ok":true}`), nil })
	runDrain(t, w)
	select {
	case got := <-waited:
		if got.CurrentStatus != queue.Succeeded || string(got.Result) != `{"ok":true}` {
			t.Fatalf("waited: %+v", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after the task succeeded")
	}
}

// TestWaitAfterCompaction: a task whose record was last written before a
// compaction is still waited for by watch, and Wait returns when it ends.
func TestWaitAfterCompaction(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	if _, err := c.Submit(ctx, "wc", []queue.Task{{ID: "old", Type: "t"}}, nil); err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(ctx, "/"+ns+"/filler", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	waited := make(chan *queue.Task, 1)
	go func() {
		got, err := c.Wait(ctx, "old")
		if err != nil {
			t.Error(err)
		}
		waited <- got
	}()
	time.Sleep(200 * time.Millisecond)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "wc", Drain: true})
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	runDrain(t, w)
	select {
	case got := <-waited:
		if got == nil || got.CurrentStatus != queue.Succeeded {
			t.Fatalf("waited: %+v", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after a compaction and the task's end")
	}
}
