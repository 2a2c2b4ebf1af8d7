package schedule

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/internal/lifecycle"
)

// Runner fires the ticks of a namespace's schedules: one due index of
// their next fires (one watch, one timer), whatever their number. Every
// drover server runs one; any number may run at once, each tick fires
// once. Start and Stop make its one lifecycle.
type Runner struct {
	Client *Client
	// Logger gets the fires that failed and will be tried again (nil:
	// slog.Default()).
	Logger *slog.Logger

	lc         lifecycle.Lifecycle
	ctx        context.Context // the run's, for the index's moves
	crashAfter int64
	// afterSubmit, if set (tests), runs after each submission, before
	// its move.
	afterSubmit func()
	fired       atomic.Int64
}

// Start starts the runner's goroutine, until Stop or ctx's end. Starting
// a started or stopped runner does nothing.
func (r *Runner) Start(ctx context.Context) {
	r.crashAfter, _ = strconv.ParseInt(os.Getenv(EnvCrashAfterSubmit), 10, 64)
	r.lc.Start(ctx, func(ctx context.Context) {
		r.ctx = ctx
		ix := &due.Index{Client: r.Client.cli, Prefix: r.Client.keys.ScheduleDue(), Move: r.move, Now: r.Client.now, Batch: 16}
		ix.Run(ctx)
	})
}

// Stop cancels the runner and waits for its goroutine: a fire in flight
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
