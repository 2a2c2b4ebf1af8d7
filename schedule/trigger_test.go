package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

// TestTriggersInOneSecondSubmitTwoTasks: each trigger has an id of its
// own, however close together.
func TestTriggersInOneSecondSubmitTwoTasks(t *testing.T) {
	now := time.Now()
	c, cli, ns := newClient(t)
	fixed, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Create(ctx, schedule.Schedule{Name: "tr", Every: queue.Duration(time.Hour), Queue: "q", Type: "t", Paused: true}); err != nil {
		t.Fatal(err)
	}
	a, err := fixed.Trigger(ctx, "tr")
	if err != nil {
		t.Fatal(err)
	}
	b, err := fixed.Trigger(ctx, "tr")
	if err != nil || a.TaskID == b.TaskID || len(b.TaskID) != len("tr-manual-261128T120000Z-00000") {
		t.Fatalf("two triggers at one instant: %q and %q (%v)", a.TaskID, b.TaskID, err)
	}
}
