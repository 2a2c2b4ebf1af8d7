package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

// TestLateClockNeverAimsBeforeAFiredTick: a client whose clock is an hour
// late resumes or reschedules a schedule: it aims past the last fired
// tick, not at ticks that already fired.
func TestLateClockNeverAimsBeforeAFiredTick(t *testing.T) {
	c, cli, ns := newClient(t)
	ctx := context.Background()
	if _, err := c.Create(ctx, schedule.Schedule{Name: "c", Every: queue.Duration(time.Second), Queue: "q", Type: "t", Overlap: schedule.Allow}); err != nil {
		t.Fatal(err)
	}
	r := &schedule.Runner{Client: c}
	r.Start(ctx)
	waitHistory(t, c, "c", 2)
	r.Stop()
	last := waitHistory(t, c, "c", 2)[0].NominalTime
	late, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns, Now: func() time.Time { return time.Now().Add(-time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := late.Pause(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	s, err := late.Resume(ctx, "c")
	if err != nil || !s.NextFireAt.After(last) {
		t.Fatalf("resume on a late clock aims at %s, not after the last fired tick %s (%v)", s.NextFireAt, last, err)
	}
	s, err = late.Update(ctx, "c", func(s *schedule.Schedule) { s.Every = queue.Duration(2 * time.Second) })
	if err != nil || !s.NextFireAt.After(last) {
		t.Fatalf("update on a late clock aims at %s, not after the last fired tick %s (%v)", s.NextFireAt, last, err)
	}
}
