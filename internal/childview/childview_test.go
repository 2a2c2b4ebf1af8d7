package childview_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/childview"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

var srv *etcdtest.Server

func TestMain(m *testing.M) { os.Exit(etcdtest.Main(m, &srv, "", nil)) }

// TestTenThousandChildren: a parent of 10,000 children (task.MaxChildren)
// is read as exact counts (one cancelled, the rest live) and one page of
// 50 in plan order, each with its state; the cursor walks every child
// once; a cancelled child shows CANCELLED; a bad cursor is an input error
// naming it; a task that spawned nothing reads empty.
func TestTenThousandChildren(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns 10,000 children")
	}
	ctx := context.Background()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(ctx, "kids", queue.Config{}); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf"})
	if err != nil {
		t.Fatal(err)
	}
	kids := make([]task.Child, task.MaxChildren)
	for i := range kids {
		kids[i] = task.Child{Queue: "kids", Type: "search"}
	}
	w.HandleAll(queue.Steps(store,
		task.Step{Name: "fan-out", Run: func(context.Context, []byte) ([]byte, error) {
			return nil, task.Spawn(kids, task.SpawnOptions{Collect: true})
		}},
		task.Step{Name: "fan-in", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }}))
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = w.Run(rctx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran; _ = w.Close(context.Background()) })
	if _, err := c.Submit(ctx, "wf", []queue.Task{{ID: "boss", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(2*time.Minute, func() bool {
		b, err := c.Get(ctx, "boss")
		return err == nil && b.CurrentStatus == queue.Waiting
	}) {
		t.Fatal("the parent does not wait for its children")
	}
	if _, err := c.Cancel(ctx, "boss.1.1"); err != nil {
		t.Fatal(err)
	}
	src := childview.Source{Etcd: cli, Namespace: ns}
	start := time.Now()
	p, err := childview.Read(ctx, src, "boss", "", 0)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the first page of 10,000 children read in %v", took)
	if p.Spawned != 10000 || p.Failed != 1 || p.Succeeded != 0 || p.Live != 9999 || len(p.Steps) != 1 || !p.Steps[0].Submitted {
		t.Fatalf("counts: %+v", p.Steps)
	}
	if len(p.Children) != childview.DefaultLimit || p.Next == "" {
		t.Fatalf("the first page: %d children, next %q", len(p.Children), p.Next)
	}
	for i, ch := range p.Children {
		want := "PENDING"
		if i == 1 {
			want = "CANCELLED"
		}
		if ch.ID != fmt.Sprintf("boss.1.%d", i) || ch.Status != want || ch.Queue != "kids" || ch.Step != 1 {
			t.Fatalf("child %d: %+v, want boss.1.%d %s", i, ch, i, want)
		}
	}
	seen, cursor := map[string]bool{}, ""
	for pages := 0; ; pages++ {
		if pages > 60 {
			t.Fatal("the cursor does not end")
		}
		pg, err := childview.Read(ctx, src, "boss", cursor, childview.MaxLimit)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range pg.Children {
			if seen[ch.ID] {
				t.Fatalf("%s listed twice", ch.ID)
			}
			seen[ch.ID] = true
		}
		if cursor = pg.Next; cursor == "" {
			break
		}
	}
	if len(seen) != 10000 {
		t.Fatalf("the pages list %d children, want 10000", len(seen))
	}
	var ie *drover.InputError
	if _, err := childview.Read(ctx, src, "boss", "1:x", 10); !errors.As(err, &ie) || ie.Field != "cursor" {
		t.Fatalf("a bad cursor: %v", err)
	}
	if none, err := childview.Read(ctx, src, "boss.1.0", "", 10); err != nil || len(none.Steps) != 0 || len(none.Children) != 0 {
		t.Fatalf("a childless task: %+v, %v", none, err)
	}
}
