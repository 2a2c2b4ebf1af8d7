package schedule_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

type clk struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clk) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clk) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// TestSubmittedTickUnrecordedIsFinishedFirst: a server submits tick T's
// task and dies before its move; the next mover comes after tick T+1 has
// passed. It records T first (its task once), and T+1's overlap check
// sees T's task: skip, not a second PENDING task.
func TestSubmittedTickUnrecordedIsFinishedFirst(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	base := time.Now().Truncate(time.Minute).Add(time.Minute)
	ck := &clk{t: base.Add(-30 * time.Second)}
	c, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns, Now: ck.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := c.Create(ctx, schedule.Schedule{Name: "x", Every: queue.Duration(time.Minute), Queue: "q", Type: "t"})
	if err != nil {
		t.Fatal(err)
	}
	T := s.NextFireAt
	// The first server dies right after its submission: its context
	// ends, so its move is never written.
	ck.set(T)
	dctx, die := context.WithCancel(ctx)
	dead := &schedule.Runner{Client: c}
	submitted := make(chan struct{})
	schedule.SetAfterSubmit(dead, func() { die(); close(submitted) })
	dead.Start(dctx)
	select {
	case <-submitted:
	case <-time.After(30 * time.Second):
		t.Fatal("tick T was not submitted in 30s")
	}
	dead.Stop()
	if f, _ := c.History(ctx, "x", 0); len(f) != 0 {
		t.Fatalf("the dead server's move was written: %+v", f)
	}
	ck.set(T.Add(61 * time.Second))
	r := &schedule.Runner{Client: c}
	r.Start(ctx)
	defer r.Stop()
	fires := waitHistory(t, c, "x", 2)
	t.Logf("history: %+v", fires)
	pending := 0
	for _, f := range fires {
		if f.Outcome == "PENDING" {
			pending++
			if !f.NominalTime.Equal(T) || f.TaskID != schedule.TaskID("x", T) {
				t.Fatalf("overlap skip fired %s while tick %s's task is PENDING; history: %+v", f.TaskID, T, fires)
			}
		}
	}
	if pending != 1 || !fires[len(fires)-1].NominalTime.Equal(T) {
		t.Fatalf("tick %s not recorded once, first: %+v", T, fires)
	}
}

// TestChangeBetweenSubmitAndMove: an update commits between a tick's
// submission and its move (which then fails); the tick is still recorded,
// once, and fires no second task.
func TestChangeBetweenSubmitAndMove(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	base := time.Now().Truncate(time.Minute).Add(time.Minute)
	ck := &clk{t: base.Add(-30 * time.Second)}
	c, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns, Now: ck.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := c.Create(ctx, schedule.Schedule{Name: "y", Every: queue.Duration(time.Minute), Queue: "q", Type: "t"})
	if err != nil {
		t.Fatal(err)
	}
	T := s.NextFireAt
	ck.set(T)
	r := &schedule.Runner{Client: c}
	var once sync.Once
	schedule.SetAfterSubmit(r, func() {
		once.Do(func() {
			if _, err := c.Update(ctx, "y", func(s *schedule.Schedule) { s.Params = []byte(`{"v":2}`) }); err != nil {
				t.Error(err)
			}
		})
	})
	r.Start(ctx)
	defer r.Stop()
	fires := waitHistory(t, c, "y", 1)
	if len(fires) != 1 || !fires[0].NominalTime.Equal(T) || fires[0].TaskID != schedule.TaskID("y", T) || fires[0].Outcome != "PENDING" {
		t.Fatalf("history after a change between submit and move: %+v", fires)
	}
	got, _ := c.Get(ctx, "y")
	if want := T.Add(time.Minute); !got.NextFireAt.Equal(want) {
		t.Fatalf("next fire %s, want %s", got.NextFireAt, want)
	}
}
