package queue

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// AheadFor is aheadFor: how many tasks a worker claims ahead of a free
// slot when its tasks take task and its claims claim.
func AheadFor(task, claim time.Duration, conc, prefetch int) int {
	return aheadFor(task, claim, conc, prefetch)
}

// ClaimAllAhead makes w claim ahead of its free running slots up to its
// Prefetch, whatever the task and claim times it measures. Call it before
// Run.
func ClaimAllAhead(w *Worker) { w.allAhead = true }

// CombinedReports returns how many combined reports c wrote, and how many
// reports they held.
func CombinedReports(c *Client) (writes, reports int64) {
	return c.remote.reports.writes.Load(), c.remote.reports.reports.Load()
}

// RememberedOutcomes returns how many outcomes c wrote from its memory of
// its claims, and how many such writes etcd refused as stale.
func RememberedOutcomes(c *Client) (hits, stale int64) {
	return c.remote.claims.hits.Load(), c.remote.claims.stale.Load()
}

// CombinedClaims returns how many combined claims c made, and how many
// claims they served with tasks.
func CombinedClaims(c *Client) (rounds, served int64) {
	return c.remote.claimers.rounds.Load(), c.remote.claimers.served.Load()
}

// ClaimAttempts returns how many claims of the store c's external claims
// made.
func ClaimAttempts(c *Client) int64 { return c.remote.attempts.Load() }

// LostClaim makes a claim of two tasks of queue q's first open segment
// under l as if its answer were lost: applied (or not) without the worker
// learning it; then resolves it (runClaim.resolve), and sends the claim's
// request once more, as a late duplicate would arrive. It returns how
// many tasks the resolution adopted, and whether etcd applied the late
// request.
func LostClaim(ctx context.Context, c *Client, q string, l *lease.Lease, applied bool) (adopted int, late bool, err error) {
	g, err := c.cli.Get(ctx, c.keys.SegmentsOpen(q), clientv3.WithPrefix(), clientv3.WithLimit(1))
	if err != nil || len(g.Kvs) == 0 {
		return 0, false, fmt.Errorf("no open segment: %v", err)
	}
	seg, _ := keyspace.Last(c.keys.SegmentsOpen(q), string(g.Kvs[0].Key))
	st, err := c.readState(ctx, q, seg)
	if err != nil {
		return 0, false, err
	}
	ts, err := c.segmentTasks(ctx, q, seg)
	if err != nil {
		return 0, false, err
	}
	w := newClaimer(c, q, l, "lost", slog.Default())
	rc := w.prepareRun(st, ts, st.free()[:2], false)
	send := func() (bool, error) {
		resp, err := c.cli.Do(ctx, rc.op())
		if err != nil {
			return false, err
		}
		made, _ := rc.result((*pb.TxnResponse)(resp.Txn()))
		return made, nil
	}
	if applied {
		if ok, err := send(); !ok || err != nil {
			return 0, false, fmt.Errorf("the claim was not applied: %v", err)
		}
	}
	adopted = len(rc.resolve())
	late, err = send()
	return adopted, late, err
}

// OutcomeUnknown is outcomeUnknown.
func OutcomeUnknown(err error) bool { return outcomeUnknown(err) }

// RunnerHeldWait is Worker.runnerHeldWait.
func RunnerHeldWait(w *Worker, limit time.Duration) time.Duration {
	return w.sched.runnerHeldWait(limit)
}

// SetClock sets the clock c names its segments by (a submitter whose
// clock is off).
func SetClock(c *Client, now func() time.Time) { c.now = now }

// PromoteScheduled moves queue q's scheduled segments due by c's clock to
// the open segments and returns how many it moved.
func PromoteScheduled(ctx context.Context, c *Client, q string) (int, error) {
	_, n, err := c.scheduledIndex(q).Promote(ctx)
	return n, err
}

// SetWatchLinger makes c's shared watches close d after their last wait
// ended instead of watchLinger. Call it before c's first wait.
func SetWatchLinger(c *Client, d time.Duration) { c.watches.lingerFor = d }

// LiveWatches returns how many shared watches of c are open.
func LiveWatches(c *Client) int64 { return c.watches.live.Load() }

// SetChildHooks sets the hooks called before a step's children are
// submitted, before the parent of finished children is woken (false: it
// is not), and between a parent's count of its children and its park.
// Call it before any worker starts; nil unsets.
func SetChildHooks(beforeSubmit func(parent string), beforeWake func(parent string) bool, beforePark func(parent string)) {
	beforeChildSubmit, beforeParentWake, beforeChildPark = beforeSubmit, beforeWake, beforePark
}

// SetCancelHook sets the hook Cancel calls between its cancel of a task
// and that of its children; nil unsets.
func SetCancelHook(beforeCascade func(parent string)) { beforeCancelCascade = beforeCascade }

// CancelAlone cancels task id without its children, as a Cancel whose
// cascade was cut short leaves it.
func CancelAlone(ctx context.Context, c *Client, id string) (*Task, error) { return c.cancel(ctx, id) }

// WakeWith is wake of task id with the writes also, waking nothing: the
// writes a signal makes, past inboxRoom's look at the store-full guard.
func (c *Client) WakeWith(ctx context.Context, id string, also []clientv3.Op) error {
	_, _, _, err := c.wake(ctx, id, nil, also, func(*Task) (bool, error) { return false, nil })
	return err
}

// SignalNamedWith is signalNamed of task id with the writes put.
func (c *Client) SignalNamedWith(ctx context.Context, id string, put []clientv3.Op) error {
	_, _, err := c.signalNamed(ctx, id, nil, put)
	return err
}

// SetBeforeParkHook sets what runs before a wait that names signals
// received is parked (nil: nothing).
func SetBeforeParkHook(f func()) {
	if f == nil {
		testHookBeforePark.Store(nil)
		return
	}
	testHookBeforePark.Store(&f)
}
