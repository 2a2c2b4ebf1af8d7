package childview_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/childview"
	"github.com/droverhq/drover/internal/childview/childviewtest"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
)

var srv *etcdtest.Server

func TestMain(m *testing.M) { os.Exit(etcdtest.Main(m, &srv, "", nil)) }

// TestTenThousandChildren: a parent of 10,000 children (task.MaxChildren)
// with 1 KiB of parameters each (a plan of about 10 MiB in 41 chunks) is
// read as exact counts (one cancelled, the rest live) and one page of 50 in
// plan order, each with its state; the cursor walks every child once; a
// cancelled child shows CANCELLED; a bad cursor is an input error naming
// it; a task that spawned nothing reads empty.
func TestTenThousandChildren(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns 10,000 children")
	}
	ctx := context.Background()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	params, _ := json.Marshal(map[string]string{"q": strings.Repeat("x", 1012)})
	c := childviewtest.Start(t, cli, ns, childviewtest.Kids(10000, params))
	childviewtest.Parent(t, c, "boss", 3*time.Minute)
	if _, err := c.Cancel(ctx, "boss.1.1"); err != nil {
		t.Fatal(err)
	}
	src := childview.Source{Etcd: cli, Namespace: ns}
	start := time.Now()
	p, err := childview.Read(ctx, src, "boss", "", 0)
	t.Logf("the first page of 10,000 children (1 KiB of parameters each) read in %v", time.Since(start))
	if err != nil {
		t.Fatal(err)
	}
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
	walk(t, src, "boss", 10000)
	var ie *drover.InputError
	for _, bad := range []string{"1:x:0", "1:2", "-1:0:0"} {
		if _, err := childview.Read(ctx, src, "boss", bad, 10); !errors.As(err, &ie) || ie.Field != "cursor" {
			t.Fatalf("cursor %q: %v", bad, err)
		}
	}
	if none, err := childview.Read(ctx, src, "boss.1.0", "", 10); err != nil || len(none.Steps) != 0 || len(none.Children) != 0 {
		t.Fatalf("a childless task: %+v, %v", none, err)
	}
}

// walk pages through the children of parent, MaxLimit at a time, and
// fails unless every one of boss.1.0 to boss.1.{n-1} is listed once, in
// order.
func walk(t *testing.T, src childview.Source, parent string, n int) {
	t.Helper()
	i, cursor := 0, ""
	for pages := 0; ; pages++ {
		if pages > n/childview.MaxLimit+2 {
			t.Fatal("the cursor does not end")
		}
		start := time.Now()
		pg, err := childview.Read(context.Background(), src, parent, cursor, childview.MaxLimit)
		if err != nil {
			t.Fatal(err)
		}
		if pages == 1 {
			t.Logf("a page of %d from cursor %s read in %v", len(pg.Children), cursor, time.Since(start))
		}
		for _, ch := range pg.Children {
			if want := fmt.Sprintf("%s.1.%d", parent, i); ch.ID != want {
				t.Fatalf("page %d lists %s, want %s", pages, ch.ID, want)
			}
			i++
		}
		if cursor = pg.Next; cursor == "" {
			break
		}
	}
	if i != n {
		t.Fatalf("the pages list %d children, want %d", i, n)
	}
}

// TestStaleChunksAreNotChildren: plan chunks no committed checkpoint
// counts (a chunk beyond the step's SpawnRecord.Chunks, the plan of a step
// the task has not reached, as a run that crashed before its checkpoint
// leaves them) show no children and count none.
func TestStaleChunksAreNotChildren(t *testing.T) {
	ctx := context.Background()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	c := childviewtest.Start(t, cli, ns, childviewtest.Kids(3, nil))
	childviewtest.Parent(t, c, "boss", 30*time.Second)
	keys := keyspace.MustNew(ns)
	phantom := `[{"id":"boss.9.0","queue":"kids","task_type":"ghost"}]`
	for _, k := range []string{keys.ChildPlanChunk("boss", 1, 1), keys.ChildPlanChunk("boss", 2, 0)} {
		if _, err := cli.Put(ctx, k, phantom); err != nil {
			t.Fatal(err)
		}
	}
	p, err := childview.Read(ctx, childview.Source{Etcd: cli, Namespace: ns}, "boss", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.Spawned != 3 || p.Live != 3 || len(p.Steps) != 1 || len(p.Children) != 3 || p.Next != "" {
		t.Fatalf("read %+v, want the 3 children of step 1 only", p)
	}
	for _, ch := range p.Children {
		if ch.Type == "ghost" {
			t.Fatalf("a phantom child is listed: %+v", p.Children)
		}
	}
}
