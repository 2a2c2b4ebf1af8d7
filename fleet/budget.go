package fleet

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BudgetGate reserves the LLM tokens a task estimates (its metadata's
// budget and estimated_tokens, for its tenant; without estimated_tokens,
// the budget's default estimate for the task's type) before the task runs, and
// settles them after: with what the handler reported through Used, or the
// estimate when it reported nothing. While the budget has no room the task
// is deferred (drover.DeferError): handed back to its queue, its attempt
// not counted. A task that names no budget passes. Its reservations are
// bound to the worker's lease, so a worker that dies releases them when
// its lease ends.
//
// The settle does not hold the task's running slot: once the handler
// returns, the gate hands the settle to a goroutine of its own and the
// task's outcome is written at once; the settle joins the budget's next
// transaction (budget's group commit), beside the reserves of the tasks
// that run next. It is as durable as before (written once etcd has it) and
// counted once (a settle deletes its reservation, under the compare that
// it exists); a worker that dies before it is written leaves the
// reservation held until the worker's lease ends, as one that dies while
// the handler runs does. Flush waits for the settles begun; a Worker's
// Run and Close call it before the lease goes.
//
// While a budget has ample room, a task is not reserved alone: it is
// admitted from a block its tenant's tasks share, reserved ahead
// (budget_block.go), with no round trip in its slot; a task without
// estimated_tokens once a reservation of its type found its default.
type BudgetGate struct {
	c      *budget.Client
	lease  func() clientv3.LeaseID
	logger *slog.Logger
	// settling counts the settles begun and not yet written.
	settling inFlight
	// beforeSettle, when a test sets it, runs before each settle is sent.
	beforeSettle func()
	// now and afterFunc are the gate's clock (time.Now, time.AfterFunc
	// unless a test sets them): a block's age and window end are read on
	// it.
	now       func() time.Time
	afterFunc func(time.Duration, func())

	mu sync.Mutex
	// used holds, per admitted attempt (usedKey), what its handler
	// reported through Used (tokens -1 while it reported nothing). The handler
	// is given a copy of the task, so the key is what the copy shares with
	// the original: its id, claim token and attempt. Admit inserts, the
	// settle deletes; Used only updates entries that exist, so neither a
	// task without a budget nor a late call from an abandoned handler
	// leaves one behind.
	used map[attemptKey]report
	// Blocks reserved ahead (budget_block.go): each tenant's open block,
	// the one reserved after it (admitted from once the open one is used
	// up), the block reserves in flight, and each budget's room as the
	// last reservation left it.
	blocks map[blockKey]*block
	next   map[blockKey]*block
	taking map[blockKey]bool
	room   map[string][2]int64
	// sizes holds the requests of each tenant's next block, when above
	// blockCalls.
	sizes map[blockKey]int64
	// defaults holds each budget's default estimate for a task type, as
	// the last reservation that took it found it, and when.
	defaults map[defaultKey]learned
}

// report is what a handler reported of one attempt: the tokens it used
// (-1: nothing yet) and the provider's rate-limit headers, if any.
type report struct {
	tokens int64
	h      http.Header
}

// attemptKey names one attempt of a task: its id, claim token and
// attempt.
type attemptKey struct {
	id      string
	token   int64
	attempt int
}

// usedKey names one attempt of t.
func usedKey(t *queue.Task) attemptKey { return attemptKey{t.ID, t.Token, t.Attempt} }

// NewBudgetGate returns a gate that reserves through c under the lease
// that lease returns.
func NewBudgetGate(c *budget.Client, lease func() clientv3.LeaseID, logger *slog.Logger) *BudgetGate {
	if logger == nil {
		logger = slog.Default()
	}
	return &BudgetGate{c: c, lease: lease, logger: logger, used: map[attemptKey]report{},
		now: time.Now, afterFunc: func(d time.Duration, f func()) { time.AfterFunc(d, f) },
		blocks: map[blockKey]*block{}, next: map[blockKey]*block{}, taking: map[blockKey]bool{}, room: map[string][2]int64{}, sizes: map[blockKey]int64{}, defaults: map[defaultKey]learned{}}
}

// unwaitableDelay is how long a task waits before it is tried again when
// waiting for the window to turn would not help: it names a budget nobody
// configured, or estimates more than the budget or the tenant's cap allows
// per window.
const unwaitableDelay = 30 * time.Second

// Admit implements queue.Gate.
//
// A task admitted from its tenant's block takes only this small frame:
// the reserve alone, whose frame is much larger, is a function of its own,
// so most tasks' goroutines do not grow their stacks for it.
func (g *BudgetGate) Admit(ctx context.Context, t *queue.Task) (func(error), error) {
	if t.Metadata.Budget == "" {
		return ignore, nil
	}
	if done, ok := g.admitFromBlock(t); ok {
		return done, nil
	}
	return g.reserveAlone(ctx, t)
}

// reserveAlone admits t with a reservation of its own.
func (g *BudgetGate) reserveAlone(ctx context.Context, t *queue.Task) (func(error), error) {
	m := &t.Metadata
	// Without estimated_tokens, the budget's default estimate for the
	// task's type (0 when it names none).
	r, err := g.c.Reserve(ctx, m.Budget, m.Tenant, m.EstimatedTokens, budget.WithLease(g.lease()), budget.WithTaskType(t.Type))
	var de *drover.DeferError
	label := m.Budget
	switch {
	case errors.Is(err, budget.ErrNoBudget):
		label = budget.UnconfiguredLabel // keys nobody configured do not each make a series
		err = &queue.DeferError{Reason: budget.WaitReason(m.Budget, budget.NotConfigured(m.Budget)), After: unwaitableDelay}
	case errors.Is(err, drover.ErrInvalidInput):
		// An estimate above the budget's tokens per window or the
		// tenant's cap: it waits for the budget to be raised, rarely tried.
		err = &queue.DeferError{Reason: budget.WaitReason(m.Budget, err.Error()), After: unwaitableDelay}
	case errors.Is(err, budget.ErrClockSkew):
		// This clock, or another writer's, is far off: retried rarely
		// until the clocks are fixed, the attempt not counted.
		err = &queue.DeferError{Reason: budget.WaitReason(m.Budget, err.Error()), After: unwaitableDelay}
	}
	if errors.As(err, &de) {
		metrics.BudgetTaskDeferrals.WithLabelValues(label).Inc()
		return nil, de
	}
	if err != nil {
		return nil, err // ctx's error, or etcd's
	}
	key := usedKey(t)
	g.mu.Lock()
	g.used[key] = report{tokens: -1}
	g.noteRoomLocked(r)
	if m.EstimatedTokens == 0 {
		g.noteDefaultLocked(m.Budget, t.Type, r.Estimate)
	}
	g.mu.Unlock()
	return func(runErr error) {
		actual := r.Estimate
		g.mu.Lock()
		rep := g.used[key]
		if rep.tokens >= 0 {
			actual = rep.tokens
		}
		delete(g.used, key)
		g.mu.Unlock()
		if errors.Is(runErr, queue.ErrNotRun) {
			actual = 0 // a later gate refused it: no call was made
		}
		id := t.ID
		g.settling.begin()
		go func() {
			defer g.settling.end()
			if g.beforeSettle != nil {
				g.beforeSettle()
			}
			g.settle(context.WithoutCancel(ctx), id, r, min(actual, r.Bound), rep.h)
		}()
	}, nil
}

// endTask records the end of the task of used-key key admitted from
// block b with estimate est: what its handler reported (or est; 0 when a
// later gate refused it).
func (g *BudgetGate) endTask(key attemptKey, b *block, est int64, runErr error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rep := g.used[key]
	delete(g.used, key)
	actual := est
	if rep.tokens >= 0 {
		actual = rep.tokens
	}
	if errors.Is(runErr, queue.ErrNotRun) {
		actual = 0
	}
	g.endInBlock(b, actual, rep.h)
}

// settleTimeout bounds one settle of the gate.
const settleTimeout = 10 * time.Second

// settle settles r of task id with actual tokens and the provider's
// headers h, logging what fails.
func (g *BudgetGate) settle(ctx context.Context, id string, r budget.Reservation, actual int64, h http.Header) {
	sctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	_, err := g.c.Settle(sctx, r, actual, h)
	if h != nil && errors.Is(err, drover.ErrInvalidInput) { // headers it cannot read: the tokens still count
		g.logger.Warn("budget settle: the provider's headers are not usable; settled without them", "budget", r.Budget, "task", id, "err", err)
		_, err = g.c.Settle(sctx, r, actual, nil)
	}
	if err != nil {
		g.logger.Warn("budget settle failed", "budget", r.Budget, "task", id, "err", err)
	}
}

// Flush waits until every settle begun (of a handler that returned) is
// written or failed, or until ctx ends (its error then).
// The blocks reserved ahead are closed first (and their reserves in
// flight waited for), then settled.
func (g *BudgetGate) Flush(ctx context.Context) error {
	if err := g.settling.wait(ctx); err != nil {
		return err
	}
	g.closeBlocks()
	return g.settling.wait(ctx)
}

// inFlight counts work begun and not ended, and lets a caller wait for
// none. The zero value is ready.
type inFlight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n falls to 0
}

func (f *inFlight) begin() {
	f.mu.Lock()
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n++
	f.mu.Unlock()
}

func (f *inFlight) end() {
	f.mu.Lock()
	f.n--
	if f.n == 0 {
		close(f.idle)
	}
	f.mu.Unlock()
}

func (f *inFlight) wait(ctx context.Context) error {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return nil
	}
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Used records that the handler running t (the task it was given, or the
// one the gate admitted) used tokens of its budget; the settle after the
// handler returns counts them instead of the estimate. A call for a task
// the gate did not admit, or after its settle, does nothing.
func (g *BudgetGate) Used(t *queue.Task, tokens int64) { g.UsedWithHeaders(t, tokens, nil) }

// UsedWithHeaders is Used with the provider's response headers h (nil:
// none): the settle passes their x-ratelimit-remaining-tokens and
// x-ratelimit-reset-tokens, which lower the budget's remaining tokens to
// the provider's count until its reset. Headers the settle cannot read
// are dropped (and logged), the tokens counted all the same. The last
// report wins.
func (g *BudgetGate) UsedWithHeaders(t *queue.Task, tokens int64, h http.Header) {
	key := usedKey(t)
	keep := keptHeaders(h)
	g.mu.Lock()
	if _, ok := g.used[key]; ok {
		g.used[key] = report{tokens: max(tokens, 0), h: keep}
	}
	g.mu.Unlock()
}

// keptHeaders is what a settle reads of h: its rate-limit headers, nil
// when it has none.
func keptHeaders(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	var keep http.Header
	for _, name := range []string{budget.HeaderRemainingTokens, budget.HeaderResetTokens} {
		if v := h.Get(name); v != "" {
			if keep == nil {
				keep = http.Header{}
			}
			keep.Set(name, v)
		}
	}
	return keep
}
