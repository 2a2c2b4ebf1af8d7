package schedule

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/internal/lifecycle"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Runner fires the ticks of a namespace's schedules: one due index of
// their next fires (one watch, one timer), whatever their number. Every
// drover server runs one; any number may run at once, each tick fires
// once. Start and Stop make its one lifecycle.
type Runner struct {
	Client *Client
	// AllNamespaces fires the schedules of every namespace that has
	// any (one due index each, started as the first schedule of a
	// namespace is created), Client's among them: what a server does,
	// whatever namespace it was started in.
	AllNamespaces bool
	// Logger gets the fires that failed and will be tried again (nil:
	// slog.Default()).
	Logger *slog.Logger

	lc         lifecycle.Lifecycle
	ctx        context.Context // the run's, for the index's moves
	crashAfter int64
	fired      atomic.Int64
	// afterSubmit, if set (tests), runs after each submission, before
	// its move.
	afterSubmit func()
}

// nsRunner fires the ticks of one namespace's schedules, c's.
type nsRunner struct {
	*Runner
	c *Client
}

// Start starts the runner's goroutines, until Stop or ctx's end. Starting
// a started or stopped runner does nothing.
func (r *Runner) Start(ctx context.Context) {
	r.lc.Start(ctx, func(ctx context.Context) {
		r.crashAfter, _ = strconv.ParseInt(os.Getenv(EnvCrashAfterSubmit), 10, 64)
		r.ctx = ctx
		if !r.AllNamespaces {
			r.runIndex(ctx, r.Client)
			return
		}
		r.runAll(ctx)
	})
}

// runIndex moves c's namespace's due items until ctx ends.
func (r *Runner) runIndex(ctx context.Context, c *Client) {
	n := &nsRunner{Runner: r, c: c}
	ix := &due.Index{Client: c.cli, Prefix: c.keys.ScheduleDue(), Move: n.move, Now: c.now, Batch: 16}
	ix.Run(ctx)
}

// runAll runs one due index per namespace that has schedules, Client's
// first, starting one as a namespace's mark appears, until ctx ends; it
// returns once every index has.
func (r *Runner) runAll(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	running := map[string]bool{}
	start := func(ns string) {
		if running[ns] {
			return
		}
		c := r.Client
		if ns != c.keys.Namespace() {
			var err error
			if c, err = r.Client.in(ns); err != nil {
				r.logger().Error("schedule namespace mark does not read", "namespace", ns, "err", err)
				running[ns] = true
				return
			}
		}
		running[ns] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.runIndex(ctx, c)
		}()
	}
	start(r.Client.keys.Namespace())
	prefix := keyspace.ScheduleNamespaces()
	for ctx.Err() == nil {
		g, err := r.Client.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err == nil {
			for _, kv := range g.Kvs {
				start(string(kv.Key[len(prefix):]))
			}
			wch := r.Client.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(),
				clientv3.WithFilterDelete(), clientv3.WithRev(g.Header.Revision+1))
			for wr := range wch {
				if wr.Err() != nil {
					break
				}
				for _, ev := range wr.Events {
					start(string(ev.Kv.Key[len(prefix):]))
				}
			}
		}
		sleep(ctx, 100*time.Millisecond+rand.N(100*time.Millisecond))
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Stop cancels the runner and waits for its goroutines: a fire in flight
// ends where it is, and the next mover picks its tick up (its task, if
// submitted, counts once). Safe to call twice, or before Start.
func (r *Runner) Stop() { _ = r.lc.Stop(context.Background()) }

func (r *Runner) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}

func (r *Runner) logf(format string, args ...any) {
	if r.ctx.Err() != nil {
		return // stopping: not an error of the fire
	}
	r.logger().Warn("schedule fire will be tried again", "err", fmt.Sprintf(format, args...))
}
