package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/groupcommit"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A budget's reserves and settles in one process are written by group
// commit: the first caller to arrive while none is writing the budget
// decides and writes its own call at once; the callers that arrive while
// that transaction is in flight queue on the budget's line, and the first
// of them decides all of them (up to batchMax), in the order they came,
// on the budget as it read it once, and writes every outcome in one
// transaction: the counters, every admitted reservation's key put and
// every settled one's deleted, under the comparison of the configuration's
// and counters' mod revisions (and each settled key's existence). Each
// caller gets its own answer: one refused, or settling an unknown
// reservation, fails alone. When the comparison fails (another process
// wrote), the transaction's else branch brings the budget as it is now,
// and the whole batch is decided again on it. Nobody waits for a timer: a
// batch is what queued while the previous transaction was in flight.

// batchMax bounds the calls one transaction carries: etcd takes 128
// operations a level, and the counters' put is one more.
const batchMax = 100

// batchTimeout bounds a transaction that carries other callers' calls: it
// is not cut short by the sender's context. A caller still waiting in
// line leaves when its own context ends.
const batchTimeout = 10 * time.Second

// call is one Reserve or Settle on a budget's line, and its answer.
type call struct {
	settle bool
	// A reserve: r as the caller filled it in (id, budget, tenant, task
	// type, lease), the estimate asked (0: the task type's default), its
	// options.
	r        Reservation
	estimate int64
	opts     reserveOpts
	// A settle: the reservation's id, the tokens used, the provider's
	// headers (remaining -1: not given).
	id     string
	actual int64
	// A block's settle (SettleBlock): the calls it admitted (-1: not a
	// block's settle).
	calls     int64
	remaining int64
	reset     time.Duration

	// The answer: a reserve's reservation, a settle's settlement, or err.
	res Reservation
	out Settlement
	err error
	// refused: err is a refusal for now (a DeferError); admitted: a
	// reserve whose key the transaction puts; lease: the own lease (hex)
	// of a settled reservation, to revoke; final: answered for good (its
	// lease ended), left out of the batch's further attempts.
	refused, admitted, final bool
	lease                    string
}

// line returns the line of budget key's writers in this process.
func (c *Client) line(key string) *groupcommit.Line[*call] {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lines[key]
	if l == nil {
		l = &groupcommit.Line[*call]{}
		c.lines[key] = l
	}
	return l
}

// submit queues k on budget key's line and returns once k is answered
// (its answer is in k), or with ctx's error when ctx ended while k waited
// in line, unsent.
func (c *Client) submit(ctx context.Context, key string, k *call) error {
	l := c.line(key)
	lead, err := l.JoinContext(ctx, k)
	if err != nil {
		return err
	}
	if !lead {
		return nil
	}
	batch, calls := l.Take(func(taken []*call, _ *call) bool { return len(taken) < batchMax })
	if len(batch) > 1 { // it carries others' calls: not cut short by this caller
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
		c.run(sctx, key, batch)
		cancel()
	} else {
		c.run(ctx, key, batch)
	}
	groupcommit.Answer(calls)
	l.HandOn()
	return nil
}

// plan is one attempt's decisions of a batch: the counters and live
// reservations after them, and the transaction that writes them.
type plan struct {
	st    state
	res   []Reservation
	ops   []clientv3.Op
	cmps  []clientv3.Cmp
	write bool
}

// run decides batch on budget key and writes the decisions, retrying on
// the budget as it is now when another writer came first.
func (c *Client) run(ctx context.Context, key string, batch []*call) {
	v, cached, err := c.view(ctx, key)
	for range maxTries {
		if err != nil {
			fail(batch, key, err)
			return
		}
		p, stale := c.decideBatch(ctx, key, v, cached, batch)
		if stale { // a refusal or an unknown reservation on the cache: read first
			v, err = c.refresh(ctx, key)
			cached = false
			continue
		}
		if !p.write {
			return
		}
		rev, fresh, werr := c.commit(ctx, key, v, p.st, p.ops, p.cmps...)
		if werr != nil {
			// The write may have happened: delete the reservations nobody
			// will settle rather than let them hold tokens until their
			// leases end.
			c.dropAdmitted(key, batch)
			if errors.Is(werr, rpctypes.ErrLeaseNotFound) && c.failEndedLeases(ctx, batch, werr) {
				continue // nothing was written: the others again, on v
			}
			fail(batch, key, werr)
			return
		}
		if fresh != nil {
			v, cached = *fresh, false
			continue
		}
		c.remember(key, view{cfg: v.cfg, st: p.st, res: current(p.res, p.st.Window), cfgMR: v.cfgMR, stMR: rev})
		return
	}
	conflicts(batch, key)
}

// fail answers every call of batch not answered for good with err.
func fail(batch []*call, key string, err error) {
	for _, k := range batch {
		if k.final {
			continue
		}
		k.refused, k.admitted = false, false
		if k.settle && errors.Is(err, ErrNoBudget) {
			k.err = fmt.Errorf("%w: %s of %s: the budget was deleted", ErrNotReserved, k.id, key)
		} else {
			k.err = err
		}
	}
}

// conflicts answers every call of batch not answered for good with the
// error of too many conflicting writers.
func conflicts(batch []*call, key string) {
	for _, k := range batch {
		if k.final {
			continue
		}
		k.refused, k.admitted = false, false
		what := "reserve"
		if k.settle {
			what = "settle"
		}
		k.err = fmt.Errorf("budget: %s %s: %d conflicting writers in a row; retry", what, key, maxTries)
	}
}

// decideBatch decides the calls of batch in order on v. stale: v came from
// the cache and a decision may be due to its being out of date (a
// refusal, an unknown reservation): read the budget and decide again.
func (c *Client) decideBatch(ctx context.Context, key string, v view, cached bool, batch []*call) (plan, bool) {
	now := c.now()
	p := plan{st: v.st, res: slices.Clone(v.res)}
	p.st.Tenants = cloneTenants(v.st.Tenants)
	skew := p.st.roll(v.cfg, now)
	for _, k := range batch {
		if k.final {
			continue
		}
		k.err, k.refused, k.admitted, k.lease = nil, false, false, ""
		var stale bool
		if k.settle {
			if skew { // counted in the stored window all the same
				_ = skewError(key, p.st.Window, p.st.Len, now)
			}
			stale = c.decideSettle(ctx, key, v.cfg, &p, k, now, cached)
		} else {
			stale = c.decideReserve(key, v.cfg, &p, k, now, cached, skew)
		}
		if stale {
			return plan{}, true
		}
	}
	return p, false
}

// decideReserve decides reserve k on p (see decideBatch for stale).
func (c *Client) decideReserve(key string, cfg Budget, p *plan, k *call, now time.Time, cached, skew bool) (stale bool) {
	tenant := k.r.Tenant
	if err := k.opts.refuse(cfg, tenant, k.estimate); err != nil {
		k.err = err
		return cached // the configuration may have changed
	}
	if skew { // nothing written: the counters stay
		k.err = skewError(key, p.st.Window, p.st.Len, now)
		return cached
	}
	st := &p.st
	// A refusal is retried when the window turns, or when the provider's
	// correction ends, whichever comes first, and never later than a window.
	after := min(time.Unix((st.Window+1)*st.Len, 0).Sub(now), time.Duration(st.Len)*time.Second)
	if st.FloorUntil != 0 {
		after = min(after, time.UnixMilli(st.FloorUntil).Sub(now))
	}
	refuse := func(no *refusal) {
		k.refused = true
		k.err = &drover.DeferError{Reason: WaitReason(key, no.reason), After: max(after, 100*time.Millisecond)}
	}
	if no := tenantRoom(st, tenant); no != nil { // not tracked: nothing to write
		refuse(no)
		return cached
	}
	r := k.r
	r.Estimate = cfg.estimateFor(k.estimate, k.opts.taskType) // of the configuration decided on
	if k.opts.block > 0 {                                     // refused without a trace: its caller reserves call by call
		if no := quietBlock(cfg, st, p.res, tenant, r.Estimate, k.opts.block); no != nil {
			refuse(no)
			return false
		}
	}
	ts := st.tenant(tenant)
	changed := ts.Seen != st.Window
	ts.Seen = st.Window
	if no := decide(cfg, st, p.res, tenant, r.Estimate); no != nil {
		if cached {
			return true
		}
		// Only a refusal of the total or of the share sets the estimate
		// aside, and the state is written only on the tenant's first ask
		// of the window or when its pending estimate grows: deferred tasks
		// of different estimates do not rewrite it on every refusal.
		if no.pend && r.Estimate > ts.Pending {
			ts.Pending, changed = r.Estimate, true
		}
		p.write = p.write || changed // mark the tenant as asking, so that its share is kept
		refuse(no)
		return false
	}
	n := max(1, k.opts.block)
	st.Requests += n
	ts.Requests += n
	ts.Pending = 0
	if n > 1 {
		r.Requests = n
	}
	r.Window, r.Bound, r.ReservedAt = st.Window, cfg.Tokens, now.UTC()
	if r.OwnLease {
		r.ExpiresAt = r.ReservedAt.Add(time.Duration(k.opts.ttl) * time.Second)
	}
	if r.Bound == 0 {
		r.Bound = MaxTokens
	}
	rv, _ := json.Marshal(r)
	p.ops = append(p.ops, clientv3.OpPut(c.keys.BudgetReservation(key, r.ID), string(rv), clientv3.WithLease(k.opts.lease)))
	p.res = append(p.res, r)
	p.write = true
	r.windowEnd = time.Unix((st.Window+1)*st.Len, 0)
	r.roomTokens, r.roomRequests = room(cfg, st, p.res)
	k.res, k.admitted = r, true
	return false
}

// decideSettle decides settle k on p (see decideBatch for stale).
func (c *Client) decideSettle(ctx context.Context, key string, cfg Budget, p *plan, k *call, now time.Time, cached bool) (stale bool) {
	i := slices.IndexFunc(p.res, func(r Reservation) bool { return r.ID == k.id })
	if i < 0 {
		k.err = fmt.Errorf("%w: %s of %s (unknown, already settled, or released when its lease ended)", ErrNotReserved, k.id, key)
		return cached // made by another client: read it
	}
	rec := p.res[i]
	if rec.OwnLease {
		// Whether its lease ended is etcd's to say, not a clock's: the
		// reserving server's clock may be minutes from this one.
		ended, err := c.leaseEnded(ctx, rec.Lease)
		if err != nil {
			k.err = err
			return false
		}
		if ended { // released, not counted; etcd deletes the key
			c.forget(key)
			p.res = slices.Delete(p.res, i, i+1)
			k.err = fmt.Errorf("%w: %s of %s: its lease ended before the settle", ErrNotReserved, k.id, key)
			return false
		}
	}
	if k.actual > rec.Bound {
		k.err = &drover.InputError{Field: "actual", Value: k.actual,
			Rule: fmt.Sprintf("must be at most %d, the budget's tokens per window when the reservation was made", rec.Bound)}
		return false
	}
	p.res = slices.Delete(p.res, i, i+1)
	if k.calls < 0 { // a block's one error is not a call's
		p.st.learn(rec.Estimate, k.actual)
	} else if rec.Window == p.st.Window {
		giveBack(&p.st, rec, k.calls)
	}
	charge := k.actual
	if rec.Window != p.st.Window {
		charge = max(0, k.actual-rec.Estimate)
	}
	p.st.Used += charge
	p.st.tenant(rec.Tenant).Used += charge
	k.out = Settlement{ID: rec.ID, Budget: key, Tenant: rec.Tenant, Estimate: rec.Estimate, Actual: k.actual, Difference: k.actual - rec.Estimate}
	if k.remaining >= 0 && cfg.Tokens > 0 {
		k.out.Corrected = p.st.correct(cfg, p.res, k.remaining, k.reset, now)
	}
	resKey := c.keys.BudgetReservation(key, k.id)
	p.ops = append(p.ops, clientv3.OpDelete(resKey))
	p.cmps = append(p.cmps, clientv3.Compare(clientv3.CreateRevision(resKey), ">", 0))
	p.write = true
	if rec.OwnLease {
		k.lease = rec.Lease
	}
	return false
}

// dropAdmitted deletes the reservation keys of batch's admitted reserves,
// best effort, in one transaction: a batch's worth of deletes one by one
// would hold its callers for as many round trips (batchMax deletes fit the
// 128 operations of a transaction).
func (c *Client) dropAdmitted(key string, batch []*call) {
	var ops []clientv3.Op
	for _, k := range batch {
		if k.admitted && !k.final {
			ops = append(ops, clientv3.OpDelete(c.keys.BudgetReservation(key, k.res.ID)))
		}
	}
	if len(ops) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = c.cli.Txn(ctx).Then(ops...).Commit()
}

// failEndedLeases answers for good, with err, the admitted reserves of
// batch whose lease has ended (etcd refused the whole transaction for
// them), and says whether there were any: the others are decided again.
func (c *Client) failEndedLeases(ctx context.Context, batch []*call, err error) bool {
	found := false
	for _, k := range batch {
		if !k.admitted || k.final {
			continue
		}
		if ended, lerr := c.leaseEnded(ctx, k.res.Lease); lerr == nil && ended {
			k.admitted, k.final = false, true
			k.err = err
			found = true
		}
	}
	return found
}
