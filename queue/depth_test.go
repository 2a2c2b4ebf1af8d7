package queue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

func tasksN(prefix string, n int) []queue.Task {
	out := make([]queue.Task, n)
	for i := range out {
		out[i] = queue.Task{ID: fmt.Sprintf("%s-%03d", prefix, i), Type: "t"}
	}
	return out
}

// TestMaxDepth: a queue bounded at 150 unfinished tasks takes 100, then 50
// of the next 100 and fails fast with ErrQueueFull, and takes more once
// tasks finish.
func TestMaxDepth(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	ctx := context.Background()
	if err := c.SetConfig(ctx, "bounded", queue.Config{MaxDepth: -1}); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("negative max depth: %v", err)
	}
	if err := c.SetConfig(ctx, "bounded", queue.Config{MaxDepth: 150}); err != nil {
		t.Fatal(err)
	}
	res, err := c.Submit(ctx, "bounded", tasksN("a", 100), nil)
	if err != nil || res.Submitted != 100 {
		t.Fatalf("first 100: %+v %v", res, err)
	}
	res, err = c.Submit(ctx, "bounded", tasksN("b", 100), nil)
	var fe *queue.QueueFullError
	if !errors.Is(err, queue.ErrQueueFull) || !errors.As(err, &fe) {
		t.Fatalf("over the bound: %+v %v", res, err)
	}
	if res.Submitted != 50 || fe.Max != 150 || fe.Submitted != 50 {
		t.Fatalf("over the bound: submitted %d, error %+v; want 50 in, then full", res.Submitted, fe)
	}
	st, err := c.Stats(ctx, "bounded")
	if err != nil || st.Pending != 150 {
		t.Fatalf("stats %+v %v, want 150 pending", st, err)
	}
	// Tasks finish: room again.
	for _, id := range []string{"a-000", "a-001", "a-002"} {
		if _, err := c.Cancel(ctx, id); err != nil {
			t.Fatalf("cancel %s: %v", id, err)
		}
	}
	res, err = c.Submit(ctx, "bounded", tasksN("c", 3), nil)
	if err != nil || res.Submitted != 3 {
		t.Fatalf("after three finished: %+v %v", res, err)
	}
	// No bound: anything goes.
	if err := c.SetConfig(ctx, "bounded", queue.Config{}); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Submit(ctx, "bounded", tasksN("d", 100), nil); err != nil || res.Submitted != 100 {
		t.Fatalf("unbounded: %+v %v", res, err)
	}
}
