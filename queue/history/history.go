package history

import (
	"context"
	"fmt"
	"time"

	"github.com/droverhq/drover/internal/qstats"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// History is a queue's history over a window, a minute at a time, oldest
// first, with the window's totals and latency percentiles.
type History = qstats.History

// Windows a history covers.
const (
	Hour = qstats.Hour
	Day  = qstats.Day
)

// Read returns queue q's history in namespace ns ("" means "drover") over
// window, Hour or Day, ending with the current minute. The minutes are
// those the drover servers closed: the minute under way is not in it yet.
// It returns queue.ErrNoQueue when nothing was ever submitted to q, and a
// drover.InputError naming window for another window.
func Read(ctx context.Context, cli *clientv3.Client, ns, q string, window time.Duration) (*History, error) {
	if err := qstats.CheckWindow("window", window); err != nil {
		return nil, err
	}
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	if ok, err := c.Exists(ctx, q); err != nil {
		return nil, err
	} else if !ok {
		return nil, fmt.Errorf("%w %s: nothing was ever submitted to it; check the name (drover queues list)", queue.ErrNoQueue, q)
	}
	return qstats.Read(ctx, cli, ns, q, window, time.Now())
}
