package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

// TestRunnerFiresEveryNamespace: a runner of namespace A with
// AllNamespaces fires a schedule created in namespace B after it started.
func TestRunnerFiresEveryNamespace(t *testing.T) {
	cli := srv.Client(t)
	nsA, nsB := etcdtest.Namespace(t)+"-a", etcdtest.Namespace(t)+"-b"
	a, err := schedule.New(schedule.Config{Etcd: cli, Namespace: nsA})
	if err != nil {
		t.Fatal(err)
	}
	b, err := schedule.New(schedule.Config{Etcd: cli, Namespace: nsB})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := &schedule.Runner{Client: a, AllNamespaces: true}
	r.Start(ctx)
	defer r.Stop()
	for _, c := range []*schedule.Client{a, b} {
		if _, err := c.Create(ctx, schedule.Schedule{Name: "s", Every: queue.Duration(time.Second), Queue: "q", Type: "t", Overlap: schedule.Allow}); err != nil {
			t.Fatal(err)
		}
	}
	waitHistory(t, a, "s", 2)
	waitHistory(t, b, "s", 2)
}
