package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// closeTimeout bounds each step of Close.
const closeTimeout = 5 * time.Second

// Worker is a queue worker assembled as drover worker assembles one: the
// process's primary lease, flow control gates, the queue worker whose claims
// are bound to that lease, and its registry entry under the same lease. Its
// lifecycle is NewWorker, Run, Close; Close is safe before Run, after a
// failed NewWorker's partial assembly, and more than once.
type Worker struct {
	cfg    Config
	logger *slog.Logger

	rt         *process.Runtime
	closeGates func(context.Context)
	budgets    *BudgetGate
	w          *queue.Worker

	closeOnce sync.Once
	closeErr  error
}

// NewWorker assembles a worker in this order: it grants the process's
// primary lease (process.Start), opens the flow control gates of cfg.Flow
// (quota slots bound to that lease), builds the queue worker with its claims
// bound to the lease and the gates in front of cfg.Worker.Gates, registers
// it in the registry (component "worker", refreshed every
// cfg.RegistryRefresh) and gives it its handlers. On failure it undoes what
// it did. A live worker with the same id is a *registry.DuplicateError.
func NewWorker(ctx context.Context, cli *clientv3.Client, cfg Config) (_ *Worker, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	w := &Worker{cfg: cfg, logger: cfg.Worker.Logger}
	if w.logger == nil {
		w.logger = slog.Default()
	}
	defer func() {
		if err != nil {
			_ = w.Close(context.WithoutCancel(ctx))
		}
	}()
	ttl := cfg.Worker.TTL
	if ttl == 0 {
		ttl = process.DefaultTTL
	}
	// The worker's claims and its registry entry share the process's
	// primary lease: both end together when it dies.
	w.rt, err = process.Start(ctx, cli, process.WithTTL(ttl), process.WithNamespace(cfg.Worker.Namespace), process.WithLogger(w.logger))
	if err != nil {
		return nil, err
	}
	wcfg := cfg.Worker
	wcfg.Lease = w.rt.Lease()
	gates, closeGates, err := cfg.Flow.Gates(ctx, cli, cfg.Worker.Namespace, func() clientv3.LeaseID { return w.rt.Lease().ID() },
		flow.WithLimiterLogger(w.logger))
	if err != nil {
		return nil, err
	}
	w.closeGates = closeGates
	// Budgets last, after the flow gates and the caller's own: a
	// reservation is not taken (nor a request charged) while another
	// gate refuses.
	w.budgets = NewBudgetGate(budget.New(cli, cfg.Worker.Namespace), func() clientv3.LeaseID { return w.rt.Lease().ID() }, w.logger)
	wcfg.Gates = append(append(Gates(gates), wcfg.Gates...), w.budgets)
	if w.w, err = queue.NewWorker(ctx, cli, wcfg); err != nil {
		return nil, err
	}
	if err := RegisterWorker(ctx, w.rt, w.w, wcfg, cfg.RegistryRefresh); err != nil {
		return nil, err
	}
	// Handlers' contexts carry their task for ReportUsage.
	if cfg.Handler != nil {
		w.w.HandleAll(w.budgets.withUsageContext(cfg.Handler))
	}
	for typ, h := range cfg.Handlers {
		w.w.Handle(typ, w.budgets.withUsageContext(h))
	}
	return w, nil
}

// Budgets returns the worker's budget gate: a handler reports the LLM
// tokens its task used with Budgets().Used(t, n).
func (w *Worker) Budgets() *BudgetGate { return w.budgets }

// ID returns the worker's id, as its claims and registry entry show it.
func (w *Worker) ID() string { return w.w.ID() }

// Stats returns what the worker has done so far.
func (w *Worker) Stats() queue.WorkerStats { return w.w.Stats() }

// Run claims and runs tasks until ctx ends (then running tasks get
// cfg.Worker.ShutdownTimeout to finish before they are handed back), the
// queue is drained (cfg.Worker.Drain), or the primary lease is lost: then
// the error matches lease.ErrLost and says the worker's tasks are claimable
// by other workers.
func (w *Worker) Run(ctx context.Context) error {
	w.logger.Info("worker started", "queue", w.cfg.Worker.Queue, "worker", w.w.ID(), "concurrency", w.cfg.Worker.Concurrency, "drain", w.cfg.Worker.Drain)
	err := w.w.Run(ctx)
	w.flushBudgets(context.WithoutCancel(ctx)) // ctx ended: that is why Run returns
	if errors.Is(err, lease.ErrLost) {
		err = fmt.Errorf("worker %s stopped: %w; its tasks are claimable by other workers", w.w.ID(), err)
	}
	return err
}

// Close takes the worker down in the reverse order of its assembly, each
// step bounded by ctx and by 5 s: the queue worker is closed (call it after
// Run returned), the gates give back held tokens and slots and stop
// following their configuration, and the runtime shuts down, revoking the
// primary lease so that the registry entry goes at once. It returns the
// errors of its steps joined; a second call returns the first call's result.
func (w *Worker) Close(ctx context.Context) error {
	w.closeOnce.Do(func() {
		var errs []error
		if w.w != nil {
			cctx, cancel := context.WithTimeout(ctx, closeTimeout)
			errs = append(errs, w.w.Close(cctx))
			cancel()
		}
		w.flushBudgets(ctx) // before the lease that holds their reservations goes
		if w.closeGates != nil {
			w.closeGates(ctx) // bounded by 5 s itself
		}
		if w.rt != nil {
			cctx, cancel := context.WithTimeout(ctx, closeTimeout)
			errs = append(errs, w.rt.Shutdown(cctx))
			cancel()
		}
		w.closeErr = errors.Join(errs...)
	})
	return w.closeErr
}

// flushBudgets waits for the budget settles of the handlers that
// returned, as long as one settle may take (flushTimeout) and ctx allow.
func (w *Worker) flushBudgets(ctx context.Context) {
	if w.budgets == nil {
		return
	}
	fctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	if err := w.budgets.Flush(fctx); err != nil {
		w.logger.Warn("budget settles still unwritten; their reservations end with the worker's lease", "err", err)
	}
}

// flushTimeout bounds a worker's wait for its budget settles: as long
// as one settle may take.
var flushTimeout = settleTimeout

// RunWorker assembles a worker (NewWorker), runs it until ctx ends, the
// queue is drained or the lease is lost (Run), and takes it down (Close). It
// returns Run's error, or Close's when Run had none.
func RunWorker(ctx context.Context, cli *clientv3.Client, cfg Config) error {
	w, err := NewWorker(ctx, cli, cfg)
	if err != nil {
		return err
	}
	runErr := w.Run(ctx)
	closeErr := w.Close(context.WithoutCancel(ctx))
	if runErr != nil {
		return runErr
	}
	return closeErr
}
