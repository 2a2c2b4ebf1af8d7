package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

// TestMissedTicksShowInHistory: ticks the catch-up policy passes over
// leave one MISSED record with their count, before the fire.
func TestMissedTicksShowInHistory(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	base := time.Now().Truncate(time.Minute).Add(time.Minute)
	ck := &clk{t: base.Add(-30 * time.Second)}
	c, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns, Now: ck.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := c.Create(ctx, schedule.Schedule{Name: "m", Every: queue.Duration(time.Minute), Queue: "q", Type: "t"})
	if err != nil {
		t.Fatal(err)
	}
	T := s.NextFireAt
	ck.set(T.Add(9*time.Minute + 30*time.Second)) // no server ran for 9 ticks
	r := &schedule.Runner{Client: c}
	r.Start(ctx)
	defer r.Stop()
	fires := waitHistory(t, c, "m", 2)
	fire, miss := fires[0], fires[1]
	if !fire.NominalTime.Equal(T.Add(9*time.Minute)) || fire.TaskID == "" {
		t.Fatalf("latest fire: %+v", fire)
	}
	if miss.Outcome != "MISSED" || miss.Count != 9 || !miss.NominalTime.Equal(T) || !miss.LastTime.Equal(T.Add(8*time.Minute)) || miss.TaskID != "" {
		t.Fatalf("missed record: %+v, want 9 ticks from %s", miss, T)
	}
}
