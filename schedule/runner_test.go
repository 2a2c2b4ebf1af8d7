package schedule_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

// waitHistory waits (bounded) until schedule name has n fires.
func waitHistory(t *testing.T, c *schedule.Client, name string, n int) []schedule.Fire {
	t.Helper()
	var fires []schedule.Fire
	if !etcdtest.Eventually(60*time.Second, func() bool {
		var err error
		fires, err = c.History(context.Background(), name, 0)
		return err == nil && len(fires) >= n
	}) {
		t.Fatalf("%s: %d fires after 60s, want %d: %+v", name, len(fires), n, fires)
	}
	return fires
}

// withTasks leaves out the MISSED records of fires.
func withTasks(fires []schedule.Fire) []schedule.Fire {
	var out []schedule.Fire
	for _, f := range fires {
		if f.Outcome != "MISSED" {
			out = append(out, f)
		}
	}
	return out
}

func TestRunnersFireEachTickOnce(t *testing.T) {
	c, cli, ns := newClient(t)
	ctx := context.Background()
	if _, err := c.Create(ctx, schedule.Schedule{Name: "tick", Every: queue.Duration(time.Second), Queue: "q", Type: "t",
		Overlap: schedule.Allow, Params: []byte(`{"a":1}`)}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // three servers' runners
		c2, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		r := &schedule.Runner{Client: c2}
		r.Start(ctx)
		t.Cleanup(r.Stop)
	}
	fires := waitHistory(t, c, "tick", 4)
	seen := map[string]bool{}
	for _, f := range fires {
		if seen[f.TaskID] || f.TaskID != schedule.TaskID("tick", f.NominalTime) || f.NominalTime.Nanosecond() != 0 {
			t.Fatalf("fire %+v: a task id twice, or not the tick's", f)
		}
		seen[f.TaskID] = true
	}
	for i := 1; i < len(fires); i++ {
		if d := fires[i-1].NominalTime.Sub(fires[i].NominalTime); d != time.Second {
			t.Fatalf("fires %d and %d are %s apart, want 1s: %+v", i-1, i, d, fires)
		}
	}
	qc, _ := queue.NewClient(cli, ns)
	task, err := qc.Get(ctx, fires[0].TaskID)
	if err != nil || task.Type != "t" || string(task.Parameters) != `{"a":1}` {
		t.Fatalf("task of a fire: %+v %v", task, err)
	}
}

func TestOverlapSkipAndTriggerAndPause(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := context.Background()
	if _, err := c.Create(ctx, schedule.Schedule{Name: "slow", Every: queue.Duration(time.Second), Queue: "q", Type: "t"}); err != nil {
		t.Fatal(err)
	}
	r := &schedule.Runner{Client: c}
	r.Start(ctx)
	defer r.Stop()
	fires := waitHistory(t, c, "slow", 3)
	// No worker runs the first task: it stays PENDING and the ticks after
	// it are skipped.
	last := fires[len(fires)-1]
	if last.Outcome != "PENDING" {
		t.Fatalf("first fire: %+v, want PENDING", last)
	}
	for _, f := range fires[:len(fires)-1] {
		if f.Outcome != "SKIPPED" || !f.SubmittedAt.IsZero() {
			t.Fatalf("a fire while the first task is pending: %+v, want SKIPPED", f)
		}
	}
	s, err := c.Pause(ctx, "slow")
	if err != nil || !s.Paused || !s.NextFireAt.IsZero() {
		t.Fatalf("pause: %+v %v", s, err)
	}
	f, err := c.Trigger(ctx, "slow")
	if err != nil || !f.Manual || !strings.Contains(f.TaskID, "-manual-") {
		t.Fatalf("trigger: %+v %v", f, err)
	}
	got, _ := c.History(ctx, "slow", 1)
	if len(got) != 1 || got[0].TaskID != f.TaskID || got[0].Outcome != "PENDING" {
		t.Fatalf("history after trigger: %+v", got)
	}
	s, err = c.Resume(ctx, "slow")
	if err != nil || s.Paused || !s.NextFireAt.After(time.Now().Add(-time.Second)) {
		t.Fatalf("resume: %+v %v", s, err)
	}
	if err := c.Delete(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "slow"); err == nil {
		t.Fatal("deleted schedule still there")
	}
}

func TestUpdateKeepsNameAndValidates(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := context.Background()
	if _, err := c.Create(ctx, schedule.Schedule{Name: "u", Cron: "0 9 * * *", Queue: "q", Type: "t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Update(ctx, "u", func(s *schedule.Schedule) { s.Cron = "0 99 * * *" }); err == nil || !strings.Contains(err.Error(), "field 2 (hour)") {
		t.Fatalf("bad update: %v", err)
	}
	s, err := c.Update(ctx, "u", func(s *schedule.Schedule) { s.Cron = "0 10 * * *"; s.TZ = "Asia/Tokyo" })
	if err != nil || s.NextFireAt.UTC().Hour() != 1 {
		t.Fatalf("update: %+v %v, want the next fire at 01:00 UTC", s, err)
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 || list[0].Cron != "0 10 * * *" {
		t.Fatalf("list: %+v %v", list, err)
	}
}

func TestOverlapBufferOneAndCancelPrevious(t *testing.T) {
	c, cli, ns := newClient(t)
	ctx := context.Background()
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []schedule.Overlap{schedule.BufferOne, schedule.CancelPrevious} {
		if _, err := c.Create(ctx, schedule.Schedule{Name: string(o), Every: queue.Duration(time.Second), Queue: "q", Type: "t", Overlap: o}); err != nil {
			t.Fatal(err)
		}
	}
	r := &schedule.Runner{Client: c}
	r.Start(ctx)
	defer r.Stop()

	// cancel-previous: each fire cancels the task before it.
	fires := waitHistory(t, c, "cancel-previous", 3)
	if fires[0].Outcome != "PENDING" || fires[1].Outcome != "CANCELLED" || fires[2].Outcome != "CANCELLED" {
		t.Fatalf("cancel-previous: %+v, want the latest PENDING and those before CANCELLED", fires)
	}

	// buffer-one: the tick after the first is held while the first task
	// is pending, and fires, with its own nominal time, once it ends.
	first := waitHistory(t, c, "buffer-one", 1)[0]
	if !etcdtest.Eventually(30*time.Second, func() bool { // held, tried again each second: two ticks pass
		s, err := c.Get(ctx, "buffer-one")
		return err == nil && s.NextFireAt.After(first.NominalTime.Add(2500*time.Millisecond))
	}) {
		t.Fatal("buffer-one's held tick was not tried again")
	}
	if n := len(withTasks(waitHistory(t, c, "buffer-one", 1))); n != 1 {
		t.Fatalf("buffer-one fired %d times while its first task is pending", n)
	}
	if _, err := qc.Cancel(ctx, first.TaskID); err != nil {
		t.Fatal(err)
	}
	second := waitHistory(t, c, "buffer-one", 2)[0]
	if !second.NominalTime.After(first.NominalTime) || second.TaskID != schedule.TaskID("buffer-one", second.NominalTime) {
		t.Fatalf("buffer-one's second fire: %+v after %+v", second, first)
	}
	if got := withTasks(waitHistory(t, c, "buffer-one", 2)); len(got) != 2 {
		t.Fatalf("buffer-one fired again while its second task is pending: %+v", got)
	}
}
