package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/task"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Handler runs one task and returns its result. Return an error made with
// Permanent for failures that retrying cannot fix; any other error is
// transient and retried with backoff while the task's budget lasts. ctx ends
// when the task times out, is cancelled, or the worker loses its claim.
type Handler func(ctx context.Context, t *Task) ([]byte, error)

// Errors a handler's context may end with (context.Cause), and the marker of
// permanent failures.
var (
	ErrPermanent = errors.New("queue: permanent failure")
	ErrTimeout   = errors.New("queue: task timed out")
	ErrCancelled = errors.New("queue: task cancelled")
	ErrShutdown  = errors.New("queue: worker shutting down; task handed back")
	// ErrNotRun is what a Gate's done hears when a later gate refused the
	// task: the handler did not run.
	ErrNotRun      = errors.New("queue: task not run: a later gate refused it")
	ErrNoHandler   = errors.New("queue: no handler for the task type")
	ErrResultLarge = errors.New("queue: result too large")
)

// PermanentError wraps a failure that retrying cannot fix.
type PermanentError struct{ Err error }

// Error implements error.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns ErrPermanent and the cause.
func (e *PermanentError) Unwrap() []error { return []error{ErrPermanent, e.Err} }

// Permanent marks err as a permanent failure: the task goes to the
// dead-letter queue without retry.
func Permanent(err error) error { return &PermanentError{Err: err} }

// WorkerConfig configures a Worker. Zero values mean the defaults.
type WorkerConfig struct {
	Namespace string
	Queue     string
	WorkerID  string
	// Concurrency is how many tasks run at once (default 8).
	Concurrency int
	// Prefetch is the most tasks claimed in one transaction (default
	// Concurrency, at most 100).
	Prefetch int
	// TTL of the worker's lease when Lease is nil (default 10 s): a dead
	// worker's tasks are claimable again about this long after it died.
	TTL   time.Duration
	Lease *lease.Lease
	// Timeout bounds one attempt of a task that sets none (default 30 m).
	Timeout time.Duration
	// BackoffBase and BackoffMax shape retry delays: a random delay up to
	// min(BackoffMax, BackoffBase*2^(attempt-1)) (full jitter). Defaults 1 s
	// and 5 m; a task may override both.
	BackoffBase, BackoffMax time.Duration
	// Drain makes Run return once the queue has nothing pending, running
	// or retrying.
	Drain bool
	// ShutdownTimeout is how long Run lets running tasks finish after its
	// context ends, before cancelling them and handing them back (default
	// 30 s).
	ShutdownTimeout time.Duration
	// Retention is how long tasks that succeeded or were cancelled are
	// kept; then the worker removes them (their counts stay in Stats).
	// Zero means DefaultRetention; negative keeps them for ever.
	Retention time.Duration
	// Gates admit each task before its handler runs, in order. Put those
	// that hand tasks back (concurrency quotas, circuit breakers) before
	// those that wait (rate limits), as drover worker does (package flow).
	Gates []Gate
	// DepthInterval is how often the worker counts the queue's tasks by
	// state for the drover_queue_tasks metric; 0 never (counting walks
	// the queue's keys in etcd, so keep it to seconds).
	DepthInterval time.Duration
	Logger        *slog.Logger
}

// Validate reports the first field that is not usable.
func (c WorkerConfig) Validate() error {
	if _, err := keyspace.New(c.Namespace); err != nil {
		return err
	}
	if err := CheckQueue(c.Queue); err != nil {
		return err
	}
	if c.WorkerID != "" {
		if err := keyspace.CheckName("worker id", c.WorkerID); err != nil {
			return err
		}
	}
	switch {
	case c.Concurrency < 0 || c.Concurrency > 10000:
		return &drover.InputError{Field: "concurrency", Value: c.Concurrency, Rule: "must be between 1 and 10000"}
	case c.Prefetch < 0 || c.Prefetch > 100:
		return &drover.InputError{Field: "prefetch", Value: c.Prefetch, Rule: "must be between 1 and 100"}
	case c.Timeout < 0, c.BackoffBase < 0, c.BackoffMax < 0, c.ShutdownTimeout < 0:
		return &drover.InputError{Field: "timeout/backoff/shutdown timeout", Rule: "must not be negative"}
	}
	if c.Lease == nil && c.TTL != 0 {
		return lease.CheckTTL("ttl", c.TTL)
	}
	return nil
}

// WorkerStats counts what a worker did.
type WorkerStats struct {
	Claimed    int64 `json:"claimed"`
	Succeeded  int64 `json:"succeeded"`
	Retried    int64 `json:"retried"`
	Dead       int64 `json:"dead"`
	HandedBack int64 `json:"handed_back"`
	Fenced     int64 `json:"fenced"`
	InFlight   int64 `json:"in_flight"`
}

// Worker claims tasks of one queue and runs their handlers.
type Worker struct {
	cfg       WorkerConfig
	cli       *clientv3.Client
	keys      keyspace.Space
	client    *Client
	lease     *lease.Lease
	ownsLease bool
	worker    string
	logger    *slog.Logger

	mu       sync.Mutex
	handlers map[string]Handler
	fallback Handler
	inflight map[string]*running

	claimed, succeeded, retried, dead, handedBack, fenced atomic.Int64
	shardCursor                                           atomic.Int64
	claimSeq                                              atomic.Int64
	fifo                                                  atomic.Bool // the queue was FIFO at the last claim
	fifoMu                                                sync.Mutex  // taken by claims of a FIFO queue
	levelMu                                               sync.Mutex
	busyLevels                                            map[string]time.Time // priority levels whose tasks all run, until when (levelMu)
	lost                                                  *orphanList          // tasks whose claim vanished: claimed first
	runnerHeld                                            map[string]time.Time // tasks a task runner holds, skipped until when (levelMu)

	// The lifecycle: Run once; Stop and StopAndCancel end it, before or
	// after it started, any number of times.
	lifeMu   sync.Mutex
	started  bool
	stopReq  chan struct{} // closed by the first Stop or StopAndCancel
	stopOnce sync.Once
	ran      chan struct{} // closed when Run returns
	hardStop atomic.Bool   // StopAndCancel: running tasks are cancelled and handed back
}

type running struct {
	cancel context.CancelCauseFunc
	token  int64 // the claim's create revision
}

// claimValue is what a claim key holds.
type claimValue struct {
	Worker    string    `json:"w"`
	Attempt   int       `json:"a"`
	ClaimedAt time.Time `json:"t"`
}

// NewWorker returns a worker; register handlers, then call Run.
func NewWorker(ctx context.Context, cli *clientv3.Client, cfg WorkerConfig) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 8
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = min(cfg.Concurrency, 100)
	}
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Minute
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = time.Second
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = 5 * time.Minute
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	client, err := NewClient(cli, cfg.Namespace)
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, cli: cli, keys: client.keys, client: client, lease: cfg.Lease, logger: logger, busyLevels: map[string]time.Time{}, lost: newOrphanList(), runnerHeld: map[string]time.Time{},
		stopReq: make(chan struct{}), ran: make(chan struct{}),
		worker: lock.NewHolder(cfg.WorkerID).ID, handlers: map[string]Handler{}, inflight: map[string]*running{}}
	w.shardCursor.Store(rand.Int64N(Shards)) // workers start on different shards
	if w.lease == nil {
		l, err := lease.Grant(ctx, cli, cfg.TTL, lease.WithLogger(logger))
		if err != nil {
			return nil, fmt.Errorf("queue: %w", err)
		}
		w.lease, w.ownsLease = l, true
	}
	return w, nil
}

// Gate admits tasks before their handler runs: flow control (rate limits,
// concurrency quotas, circuit breakers) plugs in here.
type Gate interface {
	// Admit returns once t may run, with done to be called with the
	// handler's error after it ran. It returns ctx's error when ctx ends
	// first, or a *DeferError to hand t back for later without charging
	// it a retry.
	Admit(ctx context.Context, t *Task) (done func(err error), err error)
}

// DeferError hands a task back to its queue, to be claimed again after
// After, without counting the attempt.
type DeferError struct {
	Reason string
	After  time.Duration
}

// Error implements error.
func (e *DeferError) Error() string { return fmt.Sprintf("deferred for %s: %s", e.After, e.Reason) }

// notAdmitted turns a gate's refusal into an outcome.
func (w *Worker) notAdmitted(ctx, base context.Context, c *claim, err error) outcome {
	var de *DeferError
	switch cause := context.Cause(ctx); {
	case errors.As(err, &de):
		return outcome{c: c, kind: Pending, err: err, delay: max(de.After, 100*time.Millisecond), deferred: de.Reason}
	case errors.Is(cause, ErrCancelled):
		return outcome{c: c, kind: Cancelled}
	case errors.Is(cause, ErrShutdown):
		return outcome{c: c, kind: Pending, err: ErrShutdown}
	case base.Err() != nil:
		return outcome{c: c, kind: Cancelled, err: context.Cause(base)}
	}
	// A gate that failed (etcd unreachable): hand the task back, uncharged.
	w.logger.Warn("queue: flow control could not admit a task; handing it back", "task", c.task.ID, "err", err)
	return outcome{c: c, kind: Pending, err: err, delay: time.Second, deferred: "gate-error"}
}

// Handle registers h for tasks of type taskType.
func (w *Worker) Handle(taskType string, h Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handlers[taskType] = h
}

// HandleAll registers h for every task type without a handler of its own.
func (w *Worker) HandleAll(h Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fallback = h
}

// Lease returns the lease the worker's claims are bound to.
func (w *Worker) Lease() *lease.Lease { return w.lease }

// ID returns the worker id recorded in claims and transitions.
func (w *Worker) ID() string { return w.worker }

// Stats returns what the worker has done so far.
func (w *Worker) Stats() WorkerStats {
	w.mu.Lock()
	n := int64(len(w.inflight))
	w.mu.Unlock()
	return WorkerStats{Claimed: w.claimed.Load(), Succeeded: w.succeeded.Load(), Retried: w.retried.Load(), Dead: w.dead.Load(),
		HandedBack: w.handedBack.Load(), Fenced: w.fenced.Load(), InFlight: n}
}

// Close revokes the worker's own lease: any claim still held is released at
// once. Call it after Run returns.
func (w *Worker) Close(ctx context.Context) error {
	if w.ownsLease {
		return w.lease.Close(ctx)
	}
	return nil
}

// claimed is a task this worker holds.
type claim struct {
	task       *Task
	recRev     int64
	claimKey   string
	pendingKey string
	token      int64
	claimedAt  time.Time
	broken     error // the claimed task cannot run: it goes to the DLQ
}

// outcome is how an attempt ended, to be written by the acker.
type outcome struct {
	c      *claim
	kind   Status // Succeeded, Retrying, Dead, or Pending (handed back)
	result []byte
	err    error
	delay  time.Duration
	// deferred is why flow control handed the task back (with delay), ""
	// otherwise.
	deferred string
}

// Run claims and runs tasks until ctx ends (then it shuts down gracefully:
// no new claims, running tasks get ShutdownTimeout to finish and are then
// cancelled and handed back), the queue is drained (WorkerConfig.Drain), or
// the lease is lost (lease.ErrLost).
func (w *Worker) Run(ctx context.Context) error {
	w.lifeMu.Lock()
	if w.started {
		w.lifeMu.Unlock()
		return errors.New("queue: Run was called before; a worker runs once")
	}
	w.started = true
	w.lifeMu.Unlock()
	defer close(w.ran)
	ctx, endRun := context.WithCancel(ctx)
	defer endRun()
	go func() {
		select {
		case <-w.stopReq:
			endRun()
		case <-ctx.Done():
		}
	}()
	// Handlers run under the lease, not under ctx: ctx ending asks for a
	// graceful stop, the lease ending means the claims are gone.
	base, cancelBase := context.WithCancelCause(w.lease.Context())
	defer cancelBase(nil)

	outcomes := make(chan outcome, w.cfg.Concurrency)
	// Two ackers, so one outcome request is in flight while the next fills.
	var ackers sync.WaitGroup
	for range claimers {
		ackers.Go(func() { w.acker(outcomes) })
	}

	bg, stopBG := context.WithCancel(base)
	var bgWG sync.WaitGroup
	bgWG.Add(5)
	go func() { defer bgWG.Done(); w.watchOrphans(bg) }()
	go func() { defer bgWG.Done(); w.promoteRetries(bg) }()
	go func() { defer bgWG.Done(); w.watchCancels(bg) }()
	go func() { defer bgWG.Done(); w.removeExpired(bg) }()
	go func() { defer bgWG.Done(); w.countDepth(bg) }()

	// Claimers run side by side so that one claim's round trips overlap
	// another's: a claim is two round trips (read, then the conditional
	// write), and one claimer at a time left the server waiting. The
	// overlap is for short tasks: the first claimer reserves up to
	// Prefetch free slots, so the second claims only while slots come free
	// during the first one's claim, or when Prefetch < Concurrency.
	slots := newSlotPool(w.cfg.Concurrency)
	var tasks sync.WaitGroup
	// The first loop to end (drained, lease lost, ctx ended) ends them all.
	loopCtx, endLoops := context.WithCancel(ctx)
	defer endLoops()
	errs := make(chan error, claimers)
	for range claimers {
		go func() {
			defer endLoops()
			errs <- w.loop(loopCtx, base, slots, outcomes, &tasks)
		}()
	}
	var runErr error
	for range claimers {
		if err := <-errs; err != nil && runErr == nil {
			runErr = err
		}
	}

	// Shutdown: let running tasks finish, then cancel and hand them back.
	allDone := make(chan struct{})
	go func() { tasks.Wait(); close(allDone) }()
	select {
	case <-allDone:
	case <-time.After(w.cfg.ShutdownTimeout):
		w.cancelAll(ErrShutdown)
		<-allDone
	case <-base.Done():
		<-allDone
	}
	close(outcomes)
	ackers.Wait()
	stopBG()
	bgWG.Wait()
	if err := w.lease.Err(); err != nil && runErr == nil {
		runErr = fmt.Errorf("queue: worker %s: %w", w.worker, err)
	}
	return runErr
}

func (w *Worker) cancelAll(cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.inflight {
		r.cancel(cause)
	}
}

// Stop ends Run gracefully, as ctx ending does: no new claims, running tasks
// get ShutdownTimeout to finish and are then cancelled and handed back. It
// waits for Run to return, no longer than ctx allows. Called before Run, it
// makes Run return at once; it is safe to call more than once.
func (w *Worker) Stop(ctx context.Context) error {
	w.stopOnce.Do(func() { close(w.stopReq) })
	return w.waitRan(ctx)
}

// StopAndCancel ends Run at once: no new claims, and every running task's
// context is cancelled (cause ErrShutdown) and the task handed back, its
// attempt not counted. It waits for Run to return, no longer than ctx
// allows. It is safe to call before Run, after Stop, and more than once.
func (w *Worker) StopAndCancel(ctx context.Context) error {
	w.hardStop.Store(true)
	w.stopOnce.Do(func() { close(w.stopReq) })
	w.cancelAll(ErrShutdown)
	return w.waitRan(ctx)
}

// waitRan waits for Run to return, if it started.
func (w *Worker) waitRan(ctx context.Context) error {
	w.lifeMu.Lock()
	started := w.started
	w.lifeMu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-w.ran:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("queue: stop worker %s: %w", w.worker, ctx.Err())
	}
}

// claimers is how many claim loops, and how many outcome writers, a worker
// runs at once.
const claimers = 2

// slotPool counts a worker's task slots. A claimer reserves slots before it
// claims, so that claimers running at once never claim more tasks than
// there are slots, and gives back those its claim did not fill.
type slotPool struct {
	mu    sync.Mutex
	free  int
	size  int
	freed chan struct{} // closed, and replaced, whenever slots come free
	ended chan struct{} // closed, and replaced, whenever a task ends
}

func newSlotPool(n int) *slotPool {
	return &slotPool{free: n, size: n, freed: make(chan struct{}), ended: make(chan struct{})}
}

// reserve takes up to n free slots; with none free it returns 0 and a
// channel closed once some come free.
func (p *slotPool) reserve(n int) (int, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := min(n, p.free)
	p.free -= k
	return k, p.freed
}

// release gives back n reserved slots that a claim did not fill, and wakes
// claimers waiting for a slot.
func (p *slotPool) release(n int) {
	if n == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free += n
	close(p.freed)
	p.freed = make(chan struct{})
}

// end gives back the slot of a task that ended, and wakes claimers waiting
// for a slot or for a task to end.
func (p *slotPool) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free++
	close(p.freed)
	p.freed = make(chan struct{})
	close(p.ended)
	p.ended = make(chan struct{})
}

// state returns how many slots are in use (running or reserved) and a
// channel closed once a task ends.
func (p *slotPool) state() (int, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.size - p.free, p.ended
}

// loop claims while there are free slots and waits on a watch when there is
// nothing to claim. Several loops share one slot pool.
func (w *Worker) loop(ctx, base context.Context, slots *slotPool, outcomes chan<- outcome, tasks *sync.WaitGroup) error {
	for {
		if ctx.Err() != nil {
			return nil
		}
		if base.Err() != nil {
			return context.Cause(base)
		}
		n, freed := slots.reserve(w.cfg.Prefetch)
		if n == 0 {
			select {
			case <-freed:
			case <-ctx.Done():
			case <-base.Done():
			}
			continue
		}
		claims, rev, contended, err := w.claim(ctx, n)
		slots.release(n - len(claims))
		if err != nil {
			if ctx.Err() != nil || base.Err() != nil {
				continue
			}
			w.logger.Warn("queue: claim failed; retrying", "queue", w.cfg.Queue, "err", err)
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
			case <-base.Done():
			}
			continue
		}
		for _, c := range claims {
			tasks.Add(1)
			go func() {
				defer tasks.Done()
				o := w.execute(base, c)
				outcomes <- o
				slots.end()
			}()
		}
		if len(claims) > 0 {
			continue
		}
		if contended {
			// Tasks were there but other workers won them: try again
			// at once, a little apart.
			sleepCtx(ctx, time.Duration(rand.Int64N(int64(20*time.Millisecond))))
			continue
		}
		busy, ended := slots.state()
		if w.cfg.Drain && busy == 0 {
			st, err := w.client.Stats(ctx, w.cfg.Queue)
			if err == nil && st.Unfinished() == 0 {
				return nil
			}
		}
		if !w.cfg.Drain {
			// A task of this worker ending makes nothing claimable (its
			// outcome removes its pending key with its claim); only a
			// draining worker wakes for it, to see whether it is done.
			ended = nil
		}
		if err := w.waitForWork(ctx, base, rev, ended, busy == 0); err != nil && ctx.Err() == nil && base.Err() == nil {
			w.logger.Debug("queue: watch interrupted", "err", err)
		}
	}
}

// claim takes up to n claimable tasks in one transaction: one nested
// transaction per task that succeeds only if its pending key is unchanged
// since it was read and it has no claim, and then writes the claim (bound to
// the lease) and counts the attempt. It reads shards of the pending index,
// a few at a time, starting from a different shard each call, until it has
// enough candidates. It also returns the revision its first read saw, from
// which a watch misses nothing.
func (w *Worker) claim(ctx context.Context, n int) (claims []*claim, rev int64, contended bool, err error) {
	q := w.cfg.Queue
	seq := w.claimSeq.Add(1)
	if w.fifo.Load() {
		// A FIFO queue's claims all want its oldest tasks: the worker's
		// claim loops take turns rather than race each other for them.
		w.fifoMu.Lock()
		defer w.fifoMu.Unlock()
	}
	if ids := w.lost.take(n); len(ids) > 0 {
		// A dead worker's tasks first: they have waited longest.
		cands, err := w.orphanCandidates(ctx, ids)
		if err != nil {
			w.lost.add(ids)
			return nil, 0, false, err
		}
		if len(cands) > 0 {
			claims, err := w.claimKeys(ctx, cands, n, true)
			return claims, 0, true, err // contended: claim again at once
		}
	}
	levels, fifo, first, err := w.readLevels(ctx, n)
	if err != nil {
		return nil, 0, false, err
	}
	w.fifo.Store(fifo)
	var cands, suspects []*mvccpb.KeyValue
	tried := map[string]bool{}
	for {
		lv, ok := w.pickLevel(levels, seq, tried)
		if !ok {
			break
		}
		tried[lv.name] = true
		var covered bool
		var r int64
		cands, suspects, r, covered, err = w.readPending(ctx, n, lv.name, fifo, first)
		first = nil
		if err != nil {
			return nil, 0, false, err
		}
		if rev == 0 {
			rev = r
		}
		if len(cands) > 0 {
			break
		}
		if len(suspects) > 0 {
			// Only claimed tasks: take those whose worker died.
			orphans, err := w.orphans(ctx, suspects)
			if err != nil {
				return nil, 0, false, err
			}
			suspects = nil
			if len(orphans) > 0 || lv.name == "" {
				cands = orphans
				break
			}
			w.levelMu.Lock()
			w.busyLevels[lv.name] = time.Now().Add(levelBusyFor) // all running: skip it for a moment
			w.levelMu.Unlock()
			continue
		}
		if lv.name == "" {
			break
		}
		if covered { // empty: its marker goes, unless a task came since it was read
			_, _ = w.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(w.client.levelKey(q, lv.name)), "=", lv.rev)).
				Then(clientv3.OpDelete(w.client.levelKey(q, lv.name))).Commit()
		}
	}
	// A task whose level has no marker (written before markers existed) is
	// found by the all-levels read: give its level one.
	known := make(map[string]bool, len(levels))
	for _, lv := range levels {
		known[lv.name] = true
	}
	var missing []clientv3.Op
	for _, kv := range cands {
		if lv := w.client.levelOfPending(q, string(kv.Key)); lv != "" && !known[lv] {
			known[lv] = true
			missing = append(missing, clientv3.OpPut(w.client.levelKey(q, lv), ""))
		}
	}
	if len(missing) > 0 {
		_, _ = w.cli.Txn(ctx).Then(missing...).Commit()
	}
	// Oldest first within a priority level, across the shards read.
	sort.SliceStable(cands, func(i, j int) bool {
		return w.keys.PendingOrder(q, string(cands[i].Key)) < w.keys.PendingOrder(q, string(cands[j].Key))
	})
	// A claimed task whose claim key is gone (its worker died) is
	// claimable again; such tasks sit at the head of their shards, so look
	// at them first.
	if len(suspects) > 0 {
		orphans, err := w.orphans(ctx, suspects)
		if err != nil {
			return nil, 0, false, err
		}
		cands = append(orphans, cands...)
	}
	if len(cands) == 0 {
		return nil, rev, false, nil
	}
	claims, err = w.claimKeys(ctx, cands, n, fifo)
	return claims, rev, len(claims) == 0, err
}

// claimKeys claims up to n of the pending keys cands in one transaction: one
// nested transaction per task that succeeds only if its pending key is
// unchanged since it was read and it has no claim, and then writes the claim
// (bound to the lease) and counts the attempt. Unless ordered, it takes a
// random n of the first 2n, so that workers reading the same keys do not
// all race for the same tasks.
func (w *Worker) claimKeys(ctx context.Context, cands []*mvccpb.KeyValue, n int, ordered bool) ([]*claim, error) {
	q := w.cfg.Queue
	pre := w.keys.QueuePending(q)
	cands = w.withoutRunnerHeld(cands)
	window := cands[:min(len(cands), 2*n)]
	if !ordered {
		rand.Shuffle(len(window), func(i, j int) { window[i], window[j] = window[j], window[i] })
	}
	pick := window[:min(n, len(window))]
	if len(pick) == 0 {
		return nil, nil
	}
	now := time.Now().UTC()
	ops := make([]clientv3.Op, len(pick))
	ids := make([]string, len(pick))
	attempts := make([]int, len(pick))
	for i, kv := range pick {
		id := pendingID(string(kv.Key), pre)
		var pv pendingValue
		_ = json.Unmarshal(kv.Value, &pv)
		ids[i], attempts[i] = id, pv.Attempts+1
		cv, _ := json.Marshal(claimValue{Worker: w.worker, Attempt: attempts[i], ClaimedAt: now})
		ck := w.keys.QueueClaim(q, id)
		// A task id is held by one claimer at a time, a queue worker or a
		// task runner (package task): no claim while the runner's lock on
		// the id has a holder or a waiter. The runner, for its part, waits
		// for a queue claim to end before it runs.
		runner := w.keys.Lock(keyspace.TaskLock(id))
		ops[i] = clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision), clientv3.Compare(clientv3.CreateRevision(ck), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(runner), "=", 0).WithPrefix()},
			[]clientv3.Op{clientv3.OpPut(ck, string(cv), clientv3.WithLease(w.lease.ID())), clientv3.OpPut(string(kv.Key), encodePending(attempts[i], true)), clientv3.OpGet(w.keys.TaskRecord(id))},
			[]clientv3.Op{clientv3.OpGet(runner, clientv3.WithPrefix(), clientv3.WithCountOnly())})
	}
	// Once sent, the claims may be applied whatever happens to ctx: do not
	// let a shutdown cut the request short and leave claims nobody knows.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	began := time.Now()
	tr, err := w.cli.Txn(cctx).Then(ops...).Commit()
	metrics.ObserveTxn("claim", began)
	cancel()
	if err != nil {
		return nil, err
	}
	var out []*claim
	for i, r := range tr.Responses {
		sub := r.GetResponseTxn()
		if !sub.Succeeded {
			if sub.Responses[0].GetResponseRange().Count > 0 {
				w.runnerHolds(ids[i]) // a task runner has it: skip it for a while
			}
			continue
		}
		c := &claim{claimKey: w.keys.QueueClaim(q, ids[i]), pendingKey: string(pick[i].Key), token: tr.Header.Revision, claimedAt: now}
		t := new(Task)
		kvs := sub.Responses[2].GetResponseRange().Kvs
		switch {
		case len(kvs) == 0:
			c.broken = errors.New("the task has no record")
		default:
			if err := json.Unmarshal(kvs[0].Value, t); err != nil {
				c.broken = fmt.Errorf("the task's record is unreadable: %w", err)
			}
			c.recRev = kvs[0].ModRevision
		}
		if c.broken != nil {
			w.logger.Error("queue: claimed a broken task; sending it to the dead-letter queue", "task", ids[i], "err", c.broken)
			t = &Task{ID: ids[i], Queue: q, Type: "unknown"}
		}
		t.Attempt, t.Token, t.CurrentStatus = attempts[i], tr.Header.Revision, Running
		c.task = t
		out = append(out, c)
	}
	w.claimed.Add(int64(len(out)))
	if len(out) > 0 {
		metrics.ClaimBatchSize.WithLabelValues(q).Observe(float64(len(out)))
	}
	for _, c := range out {
		metrics.TasksClaimed.WithLabelValues(q, c.task.Type).Inc()
	}
	return out, nil
}

// waitForWork blocks until something may have become claimable: a pending
// key created (a new, retried or requeued task), a claim deleted without its
// pending key (a dead worker's or handed-back task), a task of this worker
// ended, or, when draining, any claim deleted. The watch starts
// right after rev, the revision the last (empty) claim read, so nothing that
// happened since is missed.
func (w *Worker) waitForWork(ctx, base context.Context, rev int64, ended <-chan struct{}, idle bool) error {
	wctx, cancel := context.WithCancel(base)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	q := w.cfg.Queue
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev+1))
	}
	wch := w.cli.Watch(clientv3.WithRequireLeader(wctx), w.keys.Queue(q), opts...)
	fallback := time.NewTimer(30 * time.Second) // a safety net, not the mechanism
	defer fallback.Stop()
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				return wctx.Err()
			}
			if err := wr.Err(); err != nil {
				return err
			}
			if w.wakes(wr.Events, idle && w.cfg.Drain) {
				return nil
			}
		case <-ended:
			return nil
		case <-fallback.C:
			return nil
		case <-wctx.Done():
			return wctx.Err()
		}
	}
}

func (w *Worker) wakes(events []*clientv3.Event, anyClaimDelete bool) bool {
	q := w.cfg.Queue
	pre, claims := w.keys.QueuePending(q), w.keys.QueueClaims(q)
	pendingDeleted := map[string]int64{}
	for _, ev := range events {
		k := string(ev.Kv.Key)
		if ev.Type == clientv3.EventTypeDelete && strings.HasPrefix(k, pre) {
			pendingDeleted[pendingID(k, pre)] = ev.Kv.ModRevision
		}
	}
	for _, ev := range events {
		k := string(ev.Kv.Key)
		switch {
		case ev.Type == clientv3.EventTypePut && strings.HasPrefix(k, pre) && ev.IsCreate():
			return true
		case ev.Type == clientv3.EventTypeDelete && strings.HasPrefix(k, claims):
			if anyClaimDelete {
				return true
			}
			id, _ := keyspace.Last(claims, k)
			if rev, ok := pendingDeleted[id]; !ok || rev != ev.Kv.ModRevision {
				return true
			}
		}
	}
	return false
}

func watchOpened(ctx context.Context, wch clientv3.WatchChan) error {
	select {
	case wr, ok := <-wch:
		if !ok {
			return errors.New("watch closed before it opened")
		}
		return wr.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// execute runs one claimed task's handler and decides its outcome.
func (w *Worker) execute(base context.Context, c *claim) outcome {
	t := c.task
	if c.broken != nil {
		return outcome{c: c, kind: Dead, err: Permanent(c.broken)}
	}
	if t.Attempt > t.Retries()+1 {
		return outcome{c: c, kind: Dead, err: fmt.Errorf("gave up after %d attempts: the worker running it died or lost its claim", t.Attempt-1)}
	}
	timeout := time.Duration(t.Timeout)
	if timeout <= 0 {
		timeout = w.cfg.Timeout
	}
	ctx, cancel := context.WithCancelCause(base)
	defer cancel(nil)
	if w.hardStop.Load() { // claimed as StopAndCancel came: hand it back
		return outcome{c: c, kind: Pending, err: ErrShutdown}
	}
	w.mu.Lock()
	w.inflight[t.ID] = &running{cancel: cancel, token: c.token}
	if w.hardStop.Load() { // StopAndCancel came between the check and here
		cancel(ErrShutdown)
	}
	h := w.handlers[t.Type]
	if h == nil {
		h = w.fallback
	}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.inflight, t.ID)
		w.mu.Unlock()
	}()
	if h == nil {
		return outcome{c: c, kind: Dead, err: Permanent(fmt.Errorf("%w %q on worker %s", ErrNoHandler, t.Type, w.worker))}
	}
	// Flow control first; waiting there does not count against the
	// task's timeout.
	var dones []func(error)
	for _, g := range w.cfg.Gates {
		done, err := g.Admit(ctx, t)
		if err != nil {
			for _, d := range dones {
				d(ErrNotRun)
			}
			return w.notAdmitted(ctx, base, c, err)
		}
		dones = append(dones, done)
	}
	t.Deferrals = 0 // admitted: the next deferral starts the count again
	tctx, tcancel := context.WithTimeoutCause(ctx, timeout, ErrTimeout)
	defer tcancel()
	hctx := context.WithValue(tctx, claimKey{}, &claimFence{w: w, c: c, cancel: cancel, ctx: ctx})
	began := time.Now()
	result, err := call(hctx, h, t)
	for _, d := range dones {
		d(err)
	}
	outcomeLabel := "succeeded"
	if err != nil {
		outcomeLabel = "failed"
	}
	metrics.TaskDuration.WithLabelValues(t.Queue, t.Type, outcomeLabel).Observe(time.Since(began).Seconds())
	cause := context.Cause(tctx)
	switch {
	case err == nil && len(result) > MaxResult:
		return outcome{c: c, kind: Dead, err: Permanent(fmt.Errorf("%w: %d bytes, over %d", ErrResultLarge, len(result), MaxResult))}
	case err == nil:
		return outcome{c: c, kind: Succeeded, result: result}
	case errors.Is(cause, ErrCancelled):
		return outcome{c: c, kind: Cancelled}
	case errors.Is(cause, ErrShutdown):
		return outcome{c: c, kind: Pending, err: ErrShutdown}
	case base.Err() != nil:
		return outcome{c: c, kind: Cancelled, err: context.Cause(base)} // the lease is gone: so are the claims
	case errors.Is(cause, lock.ErrLost):
		return outcome{c: c, kind: Cancelled, err: cause} // the claim is gone: an outcome would be refused
	}
	if errors.Is(cause, ErrTimeout) && !errors.Is(err, ErrTimeout) {
		err = fmt.Errorf("%w after %s: %w", ErrTimeout, timeout, err)
	}
	if errors.Is(err, ErrPermanent) || t.Attempt > t.Retries() {
		return outcome{c: c, kind: Dead, err: err}
	}
	return outcome{c: c, kind: Retrying, err: err, delay: w.backoff(t)}
}

// call runs h, turning a panic into a permanent failure that carries the
// stack.
func call(ctx context.Context, h Handler, t *Task) (result []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Permanent(fmt.Errorf("handler panicked: %v\n%s", r, debug.Stack()))
		}
	}()
	return h(ctx, t)
}

// backoff is a full-jitter exponential delay for the task's next attempt.
func (w *Worker) backoff(t *Task) time.Duration {
	base, maxd := time.Duration(t.BackoffBase), time.Duration(t.BackoffMax)
	if base <= 0 {
		base = w.cfg.BackoffBase
	}
	if maxd <= 0 {
		maxd = w.cfg.BackoffMax
	}
	ceil := maxd
	if shift := t.Attempt - 1; shift < 40 && base<<shift > 0 && base<<shift < maxd {
		ceil = base << shift
	}
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// acker writes outcomes in batches: one transaction, one nested transaction
// per task, each fenced by the task's claim. It ends when outcomes is closed
// and everything in it is written.
func (w *Worker) acker(outcomes <-chan outcome) {
	batch := make([]outcome, 0, 100)
	for o := range outcomes {
		batch = append(batch[:0], o)
	more:
		for len(batch) < 100 {
			select {
			case o, ok := <-outcomes:
				if !ok {
					break more
				}
				batch = append(batch, o)
			default:
				break more
			}
		}
		w.commit(batch)
	}
}

func (w *Worker) commit(batch []outcome) {
	now := time.Now().UTC()
	var ops []clientv3.Op
	var kept []outcome
	size := 0
	for _, o := range batch {
		if o.kind == Cancelled {
			continue // the canceller or the lease took the claim away
		}
		op, n := w.ackOp(o, now)
		if len(ops) > 0 && size+n > maxRequestBytes {
			w.write(ops, kept)
			ops, kept, size = nil, nil, 0
		}
		ops, kept, size = append(ops, op), append(kept, o), size+n
	}
	w.write(ops, kept)
}

// write records outcomes in one request, retrying a few times; a request
// that keeps failing is split in two, and an outcome that cannot be written
// at all is handed back, so its task does not stay claimed under a live
// lease.
func (w *Worker) write(ops []clientv3.Op, kept []outcome) {
	if len(ops) == 0 {
		return
	}
	var resp *clientv3.TxnResponse
	var err error
	for try := 0; try < 3; try++ {
		ctx, cancel := context.WithTimeout(w.lease.Context(), 10*time.Second)
		began := time.Now()
		resp, err = w.cli.Txn(ctx).Then(ops...).Commit()
		metrics.ObserveTxn("ack", began)
		cancel()
		if err == nil || w.lease.Err() != nil {
			break
		}
		time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
	}
	if err != nil {
		if w.lease.Err() != nil {
			return // the claims went with the lease; others take the tasks
		}
		if len(ops) > 1 {
			h := len(ops) / 2
			w.write(ops[:h], kept[:h])
			w.write(ops[h:], kept[h:])
			return
		}
		if kept[0].kind == Pending {
			// Handing back failed too: keep trying while the lease lives,
			// or the task stays claimed (RUNNING) until this worker ends.
			for try := 0; try < 30 && w.lease.Err() == nil; try++ {
				time.Sleep(time.Second)
				ctx, cancel := context.WithTimeout(w.lease.Context(), 10*time.Second)
				_, err = w.cli.Txn(ctx).Then(ops...).Commit()
				cancel()
				if err == nil {
					w.handedBack.Add(1)
					return
				}
			}
			w.logger.Error("queue: could not hand a task back; it is claimable again when this worker's lease ends", "task", kept[0].c.task.ID, "err", err)
			return
		}
		w.logger.Warn("queue: could not record a task's outcome; handing it back", "task", kept[0].c.task.ID, "err", err)
		back := kept[0]
		back.kind = Pending
		back.deferred = ""
		op, _ := w.ackOp(back, time.Now().UTC())
		w.write([]clientv3.Op{op}, []outcome{back})
		return
	}
	for i, r := range resp.Responses {
		if !r.GetResponseTxn().Succeeded {
			w.fenced.Add(1)
			w.logger.Warn("queue: outcome refused: the claim was lost", "task", kept[i].c.task.ID, "attempt", kept[i].c.task.Attempt)
			continue
		}
		t := kept[i].c.task
		switch kept[i].kind {
		case Succeeded:
			w.succeeded.Add(1)
			metrics.TasksSucceeded.WithLabelValues(t.Queue, t.Type).Inc()
		case Retrying:
			w.retried.Add(1)
			metrics.TasksFailed.WithLabelValues(t.Queue, t.Type).Inc()
			metrics.TasksRetried.WithLabelValues(t.Queue, t.Type).Inc()
		case Dead:
			w.dead.Add(1)
			metrics.TasksFailed.WithLabelValues(t.Queue, t.Type).Inc()
			metrics.TasksDead.WithLabelValues(t.Queue, t.Type).Inc()
		case Pending:
			w.handedBack.Add(1)
			if kept[i].deferred != "" {
				metrics.TasksDeferred.WithLabelValues(t.Queue, t.Type, kept[i].deferred).Inc()
			}
		}
	}
}

// retryValue is what a retry key holds: where the task goes back to.
type retryValue struct {
	PendingKey string `json:"p"`
	Attempts   int    `json:"a"`
}

// ackOp is the fenced nested transaction that records one outcome.
func (w *Worker) ackOp(o outcome, now time.Time) (clientv3.Op, int) {
	c, t := o.c, o.c.task
	fence := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.claimKey), "=", c.token)}
	if o.kind == Pending && o.deferred != "" { // deferred by flow control: back after the delay, uncharged
		// Each deferral in a row doubles the delay (up to 16x, 30 s at
		// most), so a backlog held off by a quota or breaker does not keep
		// the claims busy; only the first one goes into the history.
		delay := min(o.delay<<min(t.Deferrals, 4), max(o.delay, 30*time.Second))
		if t.Deferrals == 0 {
			t.Transitions = appendTransition(t.Transitions, Transition{Status: Pending, At: now, Attempt: t.Attempt, Worker: w.worker, Error: "deferred: " + o.deferred})
		}
		t.Deferrals++
		t.CurrentStatus, t.ScheduledAt = Pending, now.Add(delay)
		t.Attempt--
		rv, _ := json.Marshal(retryValue{PendingKey: c.pendingKey, Attempts: t.Attempt})
		rec, _ := json.Marshal(t)
		return clientv3.OpTxn(fence, []clientv3.Op{clientv3.OpDelete(c.claimKey), clientv3.OpDelete(c.pendingKey),
			clientv3.OpPut(w.client.retryKey(t), string(rv)), clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec))}, nil), len(rec) + 500
	}
	if o.kind == Pending { // handed back: the attempt does not count
		return clientv3.OpTxn(fence, []clientv3.Op{clientv3.OpDelete(c.claimKey), clientv3.OpPut(c.pendingKey, encodePending(t.Attempt-1, false))}, nil), 300
	}
	t.Transitions = appendLost(t.Transitions, t.Attempt, c.claimedAt)
	t.Transitions = appendTransition(t.Transitions, Transition{Status: Running, At: c.claimedAt, Attempt: t.Attempt, Worker: w.worker})
	ops := []clientv3.Op{clientv3.OpDelete(c.claimKey), clientv3.OpDelete(c.pendingKey)}
	switch o.kind {
	case Succeeded:
		t.CurrentStatus, t.Result, t.LastError, t.RetriesAttempted = Succeeded, o.result, "", t.Attempt-1
		ops = append(ops, clientv3.OpPut(w.client.doneKey(t.Queue, Succeeded, now, t.ID), ""))
	case Retrying:
		t.CurrentStatus, t.RetriesAttempted, t.LastError = Retrying, t.Attempt-1, truncate(o.err.Error(), 4096)
		t.ScheduledAt = now.Add(o.delay)
		rv, _ := json.Marshal(retryValue{PendingKey: c.pendingKey, Attempts: t.Attempt})
		ops = append(ops, clientv3.OpPut(w.client.retryKey(t), string(rv)))
	case Dead:
		t.CurrentStatus, t.RetriesAttempted, t.LastError = Dead, t.Attempt-1, truncate(o.err.Error(), 4096)
		ops = append(ops, clientv3.OpPut(w.keys.QueueDead(t.Queue)+t.ID, ""))
	}
	tr := Transition{Status: t.CurrentStatus, At: now, Attempt: t.Attempt, Worker: w.worker}
	if o.err != nil {
		tr.Error = truncate(o.err.Error(), 4096)
	}
	t.Transitions = appendTransition(t.Transitions, tr)
	t.Token = c.token
	rec, _ := json.Marshal(t)
	ops = append(ops, clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec)))
	return clientv3.OpTxn(fence, ops, nil), len(rec) + 500
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// promoteRetries moves retry keys whose time has come back to pending. It
// sleeps until the earliest one is due and wakes early when a retry is
// scheduled, so no task is polled. Several workers may race for one retry;
// each move is a transaction that only one wins.
func (w *Worker) promoteRetries(ctx context.Context) {
	pre := w.keys.QueueRetry(w.cfg.Queue)
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		wch := w.cli.Watch(clientv3.WithRequireLeader(wctx), pre, clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify())
		if err := watchOpened(wctx, wch); err != nil {
			cancel()
			sleepCtx(ctx, time.Second)
			continue
		}
		for ctx.Err() == nil {
			due, err := w.promoteDue(wctx, pre)
			if err != nil {
				break
			}
			var timer *time.Timer
			var fire <-chan time.Time
			if !due.IsZero() {
				timer = time.NewTimer(time.Until(due))
				fire = timer.C
			}
			reopenNow := false
			select {
			case <-fire:
			case wr, ok := <-wch:
				reopenNow = !ok || wr.Err() != nil
			case <-ctx.Done():
			}
			if timer != nil {
				timer.Stop()
			}
			if reopenNow {
				goto reopen
			}
		}
	reopen:
		cancel()
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// promoteDue moves every due retry back to pending and returns when the next
// one is due (zero when none is scheduled).
func (w *Worker) promoteDue(ctx context.Context, pre string) (time.Time, error) {
	for {
		now := time.Now()
		g, err := w.cli.Get(ctx, pre, clientv3.WithRange(keyspace.TimeBound(pre, now.UnixNano()+1)), clientv3.WithLimit(50))
		if err != nil {
			return time.Time{}, err
		}
		if len(g.Kvs) > 0 {
			ops := make([]clientv3.Op, 0, len(g.Kvs))
			var markers []clientv3.Op
			levels := map[string]bool{}
			for _, kv := range g.Kvs {
				var rv retryValue
				if json.Unmarshal(kv.Value, &rv) != nil || rv.PendingKey == "" {
					w.logger.Error("queue: dropping an unreadable retry key", "key", string(kv.Key))
					ops = append(ops, clientv3.OpDelete(string(kv.Key)))
					continue
				}
				ops = append(ops, clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)},
					[]clientv3.Op{clientv3.OpDelete(string(kv.Key)), clientv3.OpPut(rv.PendingKey, encodePending(rv.Attempts, false))}, nil))
				if lv := w.client.levelOfPending(w.cfg.Queue, rv.PendingKey); lv != "" && !levels[lv] {
					levels[lv] = true
					markers = append(markers, clientv3.OpPut(w.client.levelKey(w.cfg.Queue, lv), ""))
				}
			}
			ops = append(ops, markers...)
			if _, err := w.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				return time.Time{}, err
			}
			if g.More {
				continue
			}
		}
		next, err := w.cli.Get(ctx, pre, clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
		if err != nil || len(next.Kvs) == 0 {
			return time.Time{}, err
		}
		ns, _, _ := keyspace.ParseTimedKey(pre, string(next.Kvs[0].Key))
		return time.Unix(0, ns), nil
	}
}

// watchCancels cancels the context of a running task when someone asks to
// cancel it.
func (w *Worker) watchCancels(ctx context.Context) {
	pre := w.keys.QueueCancel(w.cfg.Queue)
	var last int64 // the last revision seen: a reopened watch resumes after it
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterDelete()}
		if last > 0 {
			opts = append(opts, clientv3.WithRev(last+1))
		}
		wch := w.cli.Watch(clientv3.WithRequireLeader(ctx), pre, opts...)
		for wr := range wch {
			if wr.CompactRevision > 0 {
				last = 0 // fell behind compaction: start from now
			} else if wr.Header.Revision > last {
				last = wr.Header.Revision
			}
			for _, ev := range wr.Events {
				id, _ := keyspace.Last(pre, string(ev.Kv.Key))
				w.mu.Lock()
				if r := w.inflight[id]; r != nil {
					r.cancel(ErrCancelled)
				}
				w.mu.Unlock()
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// removeExpired removes finished tasks past their retention, every
// retention/24 (between a minute and an hour), until ctx ends.
func (w *Worker) removeExpired(ctx context.Context) {
	if w.cfg.Retention < 0 {
		return
	}
	every := min(max(w.cfg.Retention/24, time.Minute), time.Hour)
	for {
		if n, err := w.client.RemoveExpired(ctx, w.cfg.Queue, w.cfg.Retention); err != nil && ctx.Err() == nil {
			w.logger.Warn("queue: removing expired tasks failed; trying again later", "queue", w.cfg.Queue, "err", err)
		} else if n > 0 {
			w.logger.Info("queue: removed expired tasks", "queue", w.cfg.Queue, "tasks", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

type claimKey struct{}

// claimFence is a running task's claim as a fence for writes made while
// handling it (see Steps).
type claimFence struct {
	w      *Worker
	c      *claim
	cancel context.CancelCauseFunc // ends the handler's context
	ctx    context.Context         // the claim's: ends with a cancel, the lease, or the attempt
}

var _ lease.Fence = (*claimFence)(nil)

// Txn starts a transaction that commits only while the claim is held.
func (f *claimFence) Txn(ctx context.Context) clientv3.Txn {
	return lease.NewFencedTxn(ctx, f.w.cli, lease.Spec{
		Name:  fmt.Sprintf("claim of task %s", f.c.task.ID),
		Token: f.c.token,
		Cmp:   clientv3.Compare(clientv3.CreateRevision(f.c.claimKey), "=", f.c.token),
		Check: f.Err,
		Lost:  func(cause error) { f.cancel(fmt.Errorf("%w: claim lost: %w", lock.ErrLost, cause)) },
	})
}

// Token is the claim's fencing token.
func (f *claimFence) Token() int64 { return f.c.token }

// Context is cancelled when the claim ends: the task was cancelled, the
// worker's lease was lost, a write under the claim was refused, or the
// attempt is over.
func (f *claimFence) Context() context.Context { return f.ctx }

// Err reports the worker's lease loss, which ends every claim, and the end
// of the claim's context.
func (f *claimFence) Err() error {
	if err := f.w.lease.Err(); err != nil {
		return err
	}
	if f.ctx.Err() != nil {
		return context.Cause(f.ctx)
	}
	return nil
}

// ClaimFence returns the claim of the task a handler runs, as a lease.Fence:
// writes made with its Txn commit only while the claim is held, and its
// Context ends when the claim does. It is nil outside a handler.
func ClaimFence(ctx context.Context) lease.Fence {
	if f, ok := ctx.Value(claimKey{}).(*claimFence); ok {
		return f
	}
	return nil
}

// Steps returns a handler that runs each task as agent steps, with the task
// runner's checkpoints (see package task): the first step gets the task's
// parameters, every step's checkpoint is written fenced by the task's claim,
// and an attempt that follows one that died (a worker killed, a claim lost)
// resumes after the last checkpointed step instead of starting over. The
// result is the last step's state. A step's error fails the attempt (and is
// retried like any handler error).
func Steps(store *task.Store, steps ...task.Step) Handler {
	return func(ctx context.Context, t *Task) ([]byte, error) {
		f, ok := ctx.Value(claimKey{}).(*claimFence)
		if !ok {
			return nil, Permanent(errors.New("queue.Steps handler run outside a worker"))
		}
		res, err := store.RunSteps(ctx, f, t.ID, steps, task.StepConfig{Worker: f.w.worker, Initial: t.Parameters})
		if err != nil {
			var tl *task.StateTooLargeError
			if errors.As(err, &tl) || errors.Is(err, task.ErrStepsChanged) {
				return nil, Permanent(err)
			}
			return nil, err
		}
		return res.State, nil
	}
}

// countDepth sets the drover_queue_tasks gauges every DepthInterval.
func (w *Worker) countDepth(ctx context.Context) {
	if w.cfg.DepthInterval <= 0 {
		return
	}
	t := time.NewTicker(w.cfg.DepthInterval)
	defer t.Stop()
	for {
		if st, err := w.client.Stats(ctx, w.cfg.Queue); err == nil {
			q := w.cfg.Queue
			for state, n := range map[string]int64{"pending": st.Pending, "running": st.Running, "retrying": st.Retrying,
				"succeeded": st.Succeeded, "dead": st.Dead, "cancelled": st.Cancelled} {
				metrics.QueueTasks.WithLabelValues(q, state).Set(float64(n))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// levelBusyFor is how long a priority level whose tasks are all running is
// skipped before it is read again.
const levelBusyFor = 500 * time.Millisecond

// level is a priority level marker; name "" stands for every level.
type level struct {
	name string
	rev  int64
}

// firstRead is the head of one shard, read with the level markers.
type firstRead struct {
	start int
	kvs   []*mvccpb.KeyValue
	rev   int64
}

// readLevels returns queue's priority level markers, highest priority first,
// and whether the queue is FIFO; in the same read it takes the head of the
// next shard, which a claim of a queue with one level uses as its first
// read, so that the markers cost no round trip of their own.
func (w *Worker) readLevels(ctx context.Context, n int) ([]level, bool, *firstRead, error) {
	start := int(w.shardCursor.Add(1))
	resp, err := w.cli.Txn(ctx).Then(
		clientv3.OpGet(w.keys.QueueLevels(w.cfg.Queue), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(w.keys.QueueConfig(w.cfg.Queue)),
		clientv3.OpGet(w.client.shardPrefix(w.cfg.Queue, start%Shards), clientv3.WithPrefix(), clientv3.WithLimit(int64(2*n+8))),
	).Commit()
	if err != nil {
		return nil, false, nil, fmt.Errorf("queue: read the priority levels of %s: %w", w.cfg.Queue, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	out := make([]level, 0, len(kvs))
	for _, kv := range kvs {
		name, _ := keyspace.Last(w.keys.QueueLevels(w.cfg.Queue), string(kv.Key))
		out = append(out, level{name: name, rev: kv.ModRevision})
	}
	var cfg Config
	if c := resp.Responses[1].GetResponseRange().Kvs; len(c) == 1 {
		_ = json.Unmarshal(c[0].Value, &cfg)
	}
	return out, cfg.FIFO, &firstRead{start: start, kvs: resp.Responses[2].GetResponseRange().Kvs, rev: resp.Header.Revision}, nil
}

// pickLevel chooses the priority level the next read takes tasks from; false
// when every choice was tried. The rule: seven claims in eight read the
// highest level with tasks that are not all running; every eighth reads the
// levels below it in turn, so no level starves; every 64th, or whenever the
// queue has one level or none, reads every level at once (shard order, which
// also finds tasks whose level has no marker).
func (w *Worker) pickLevel(levels []level, seq int64, tried map[string]bool) (level, bool) {
	if len(levels) <= 1 || seq%64 == 0 {
		return level{}, !tried[""]
	}
	now := time.Now()
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	var open []level
	for _, lv := range levels {
		if !tried[lv.name] && now.After(w.busyLevels[lv.name]) {
			open = append(open, lv)
		}
	}
	switch {
	case len(open) == 0:
		return level{}, !tried[""]
	case seq%8 == 0 && len(open) > 1:
		return open[1+int(seq/8)%(len(open)-1)], true
	}
	return open[0], true
}

// readPending reads up to about 2n pending keys of priority level lv (""
// every level): one shard first, then the following shards several at a
// time, starting from a different shard each call (shard 0 in a FIFO queue).
// covered says every shard was read.
func (w *Worker) readPending(ctx context.Context, n int, lv string, fifo bool, pre *firstRead) (cands, suspects []*mvccpb.KeyValue, rev int64, covered bool, err error) {
	q := w.cfg.Queue
	perRead := 8
	if lv != "" {
		perRead = 32 // a level may be sparse: read wide
	}
	classify := func(kvs []*mvccpb.KeyValue) {
		for _, kv := range kvs {
			var pv pendingValue
			if json.Unmarshal(kv.Value, &pv) == nil && pv.Claimed {
				suspects = append(suspects, kv)
			} else {
				cands = append(cands, kv)
			}
		}
	}
	var start, read int
	switch {
	case fifo:
		start = 0 // a FIFO queue's tasks are in shard 0: read it first, in order
	case lv == "" && pre != nil: // the first shard came with the level markers
		start, read, rev = pre.start, 1, pre.rev
		classify(pre.kvs)
	default:
		start = int(w.shardCursor.Add(1))
	}
	next := start + read
	for ; next < start+Shards && len(cands) < n; read++ {
		width, limit := 1, int64(2*n+8)
		if read > 0 || lv != "" && !fifo {
			width, limit = perRead, int64(2*n/perRead+4)
		}
		ops := make([]clientv3.Op, 0, width)
		for j := 0; j < width && next < start+Shards; j++ {
			ops = append(ops, clientv3.OpGet(w.client.shardPrefix(q, next%Shards)+lv, clientv3.WithPrefix(), clientv3.WithLimit(limit)))
			next++
		}
		resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, nil, 0, false, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, r := range resp.Responses {
			classify(r.GetResponseRange().Kvs)
		}
	}
	return cands, suspects, rev, next >= start+Shards, nil
}

// orphans returns the claimed pending keys among suspects (at most 100)
// whose claim key is gone: their worker died, and they are claimable again.
func (w *Worker) orphans(ctx context.Context, suspects []*mvccpb.KeyValue) ([]*mvccpb.KeyValue, error) {
	q, pre := w.cfg.Queue, w.keys.QueuePending(w.cfg.Queue)
	suspects = suspects[:min(len(suspects), 100)]
	ops := make([]clientv3.Op, len(suspects))
	for i, kv := range suspects {
		ops[i] = clientv3.OpGet(w.keys.QueueClaim(q, pendingID(string(kv.Key), pre)), clientv3.WithCountOnly())
	}
	resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	var out []*mvccpb.KeyValue
	for i, r := range resp.Responses {
		if r.GetResponseRange().Count == 0 {
			out = append(out, suspects[i])
		}
	}
	return out, nil
}
