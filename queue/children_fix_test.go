package queue_test

import (
	"context"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// A child cancelled while it ran in one segment run with its siblings:
// the run's other outcomes, written again without the cancelled one's,
// are recorded, and the parent resumes.
func TestChildCancelledInARunLetsSiblingsEnd(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	f := newFamily(3)
	release, stopped := make(chan struct{}), make(chan struct{})
	f.child = func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		select {
		case <-release:
			return tk.Parameters, nil
		case <-ctx.Done():
			close(stopped) // the cancelled one
			return nil, context.Cause(ctx)
		}
	}
	setupFamily(t, c, "p")
	f.start(t, cli, ns)
	waitUntil(t, "the children to run", func() bool {
		st, err := c.Stats(ctx, "kids")
		return err == nil && st.Running == 3
	})
	if _, err := c.Cancel(ctx, "p.1.0"); err != nil {
		t.Fatal(err)
	}
	<-stopped
	close(release)
	for _, id := range []string{"p.1.1", "p.1.2"} {
		k := waitFinished(t, c, id)
		if k.CurrentStatus != queue.Succeeded {
			t.Fatalf("child %s: %s (%s); want SUCCEEDED", id, k.CurrentStatus, k.LastError)
		}
	}
	waitFinished(t, c, "p")
}
