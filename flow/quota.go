package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/kv"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNoQuota is returned for a quota that has no configuration.
var ErrNoQuota = errors.New("flow: quota not configured")

// MaxQuota is the largest concurrency quota.
const MaxQuota = 100000

// Quota scopes: the special quota names that count per tenant and per task
// type. Any other name is a named resource (a database, an API key) that
// tasks hold.
const (
	PerTenant = "tenant"
	PerType   = "type"
)

// CheckQuotaLimit returns an InputError unless 1 <= k <= MaxQuota.
func CheckQuotaLimit(field string, k int) error {
	if k < 1 || k > MaxQuota {
		return &drover.InputError{Field: field, Value: k, Rule: fmt.Sprintf("must be between 1 and %d", MaxQuota)}
	}
	return nil
}

// QuotaConfig is a quota's configuration: a limit for every subject (0: no
// limit) and limits for some subjects (a tenant that paid for 2 agents).
type QuotaConfig struct {
	Limit    int            `json:"limit"`
	Subjects map[string]int `json:"subjects,omitempty"`
}

// For returns the limit of subject, 0 for none.
func (c QuotaConfig) For(subject string) int {
	if k, ok := c.Subjects[subject]; ok {
		return k
	}
	return c.Limit
}

// Check returns an InputError for the first limit out of range.
func (c QuotaConfig) Check(field string) error {
	if c.Limit != 0 {
		if err := CheckQuotaLimit(field, c.Limit); err != nil {
			return err
		}
	}
	for s, k := range c.Subjects {
		if err := CheckQuotaLimit(field+" "+s, k); err != nil {
			return err
		}
	}
	return nil
}

// Quota is a fleet-wide concurrency quota: at most K tasks run at once per
// tenant (quota "tenant"), per task type (quota "type"), or in total for a
// named resource.
//
// Slots are granted to workers in batches, as rate-limit tokens are: each
// worker holds a grant per subject, a key bound to its lease whose value is
// how many slots it holds, and runs at most that many tasks of the subject.
// A grant grows in one transaction that reads every grant of the subject and
// rewrites the subject's ledger key only if it is unchanged since that read,
// so two workers can never both take the last free slot: the grants never
// sum to more than K. Shrinking needs no such check. A worker gives back
// slots it has not used for grantIdle, and a dead worker's grants vanish
// with its lease. So a task usually takes its slot without a round trip to
// etcd. A refused task is deferred (handed back to the queue for about a
// second, its attempt not counted), so it waits in the queue, not in a
// worker slot that other tenants could use.
type Quota struct {
	cli    *clientv3.Client
	keys   keyspace.Space
	name   string
	types  []string
	lease  func() clientv3.LeaseID
	logger *slog.Logger
	// fullReason is the reason of the quota's deferrals.
	fullReason string

	mu     sync.Mutex
	cfg    QuotaConfig
	grants map[string]*grant

	stop context.CancelFunc
	done chan struct{}
}

// NewQuota returns a handle on quota name whose slots are bound to the lease
// that lease returns (the worker's). def, when it sets any limit, configures
// the quota if nobody has; etcd's configuration wins otherwise and changes
// are followed live. types, when given, limits the quota to tasks of those
// types.
func NewQuota(ctx context.Context, cli *clientv3.Client, ns, name string, def QuotaConfig, lease func() clientv3.LeaseID, types ...string) (*Quota, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	if err := keyspace.CheckName("quota name", name); err != nil {
		return nil, err
	}
	q := &Quota{cli: cli, keys: keys, name: name, types: types, lease: lease, logger: slog.Default(), fullReason: "quota " + name + " full",
		done: make(chan struct{}), grants: map[string]*grant{}}
	if def.Limit > 0 || len(def.Subjects) > 0 {
		if err := def.Check("quota"); err != nil {
			return nil, err
		}
		if err := seedConfig(ctx, cli, slog.Default(), keys.QuotaConfig(name), "quota", name, "drover quotas set "+name+" K", def); err != nil {
			return nil, err
		}
	}
	cfg, rev, err := GetQuota(ctx, cli, ns, name)
	if err != nil {
		return nil, err
	}
	q.cfg = cfg
	metrics.QuotaWaits.WithLabelValues(name) // the series exists from the start, at 0
	wctx, cancel := context.WithCancel(context.Background())
	q.stop = cancel
	go func() {
		defer close(q.done)
		followKey(wctx, cli, keys.QuotaConfig(name), rev, func(kv *mvccpb.KeyValue, _ int64) {
			var c QuotaConfig
			if kv != nil && json.Unmarshal(kv.Value, &c) == nil {
				q.mu.Lock()
				q.cfg = c
				q.mu.Unlock()
			}
		})
	}()
	return q, nil
}

// GetQuota reads quota name's configuration and the revision it was read at.
func GetQuota(ctx context.Context, cli *clientv3.Client, ns, name string) (QuotaConfig, int64, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return QuotaConfig{}, 0, err
	}
	g, err := cli.Get(ctx, keys.QuotaConfig(name))
	if err != nil {
		return QuotaConfig{}, 0, fmt.Errorf("flow: read quota %s: %w", name, err)
	}
	if len(g.Kvs) == 0 {
		return QuotaConfig{}, 0, fmt.Errorf("%w: %s (set it with `drover quotas set %s K`)", ErrNoQuota, name, name)
	}
	var c QuotaConfig
	if err := json.Unmarshal(g.Kvs[0].Value, &c); err != nil {
		return QuotaConfig{}, 0, fmt.Errorf("flow: quota %s has an unreadable configuration: %w", name, err)
	}
	return c, g.Kvs[0].ModRevision, nil
}

// SetQuota sets quota name's limit for subject ("" for every subject that
// has no limit of its own; limit 0 removes a subject's own limit), in one
// compare-and-swap; every worker follows within a moment. Lowering a limit
// does not stop running tasks; new ones wait until fewer hold.
func SetQuota(ctx context.Context, cli *clientv3.Client, ns, name, subject string, limit int) error {
	keys, err := keyspace.New(ns)
	if err != nil {
		return err
	}
	if err := keyspace.CheckName("quota name", name); err != nil {
		return err
	}
	if limit != 0 || subject == "" {
		if err := CheckQuotaLimit("limit", limit); err != nil {
			return err
		}
	}
	err = kv.Update(ctx, cli, keys.QuotaConfig(name), func(old []byte) ([]byte, error) {
		var c QuotaConfig
		if old != nil {
			_ = json.Unmarshal(old, &c)
		}
		switch {
		case subject == "":
			c.Limit = limit
		case limit == 0:
			delete(c.Subjects, subject)
		default:
			if c.Subjects == nil {
				c.Subjects = map[string]int{}
			}
			c.Subjects[subject] = limit
		}
		return json.Marshal(c)
	})
	if err != nil {
		return fmt.Errorf("flow: set quota %s: %w", name, err)
	}
	return nil
}

// Config returns the quota's current configuration.
func (q *Quota) Config() QuotaConfig {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cfg
}

// subject returns the slot group c counts in (its name, and its form in
// keys), "" when the quota does not apply.
func (q *Quota) subject(c Call) (name, key string) {
	if len(q.types) > 0 && !slices.Contains(q.types, c.Type) {
		return "", ""
	}
	switch q.name {
	case PerTenant:
		if c.Tenant == "" {
			return "", ""
		}
		return c.Tenant, keyspace.EscapeSubject(c.Tenant)
	case PerType:
		return c.Type, c.Type
	}
	return "-", "-"
}

// grantIdle is how long a worker keeps slots it does not use before giving
// them back to the fleet.
const grantIdle = 100 * time.Millisecond

// grant is this worker's share of one subject's slots.
type grant struct {
	grow  sync.Mutex // one change of the grant at a time
	held  int        // slots granted to this worker
	inUse int
	peak  int // most in use since the last shrink
	lease clientv3.LeaseID
	timer *time.Timer // gives idle slots back
}

// Acquire takes a slot for c. It returns release (nil when the quota does
// not apply to c) and whether the slot was granted.
func (q *Quota) Acquire(ctx context.Context, c Call) (release func(), ok bool, err error) {
	name, subject := q.subject(c)
	if subject == "" {
		return nil, true, nil
	}
	limit := q.Config().For(name)
	if limit <= 0 {
		return nil, true, nil
	}
	q.mu.Lock()
	g := q.grants[subject]
	if g == nil {
		g = &grant{}
		q.grants[subject] = g
	}
	if q.take(g, limit) {
		q.mu.Unlock()
		return func() { q.release(subject, g) }, true, nil
	}
	q.mu.Unlock()
	g.grow.Lock()
	defer g.grow.Unlock()
	q.mu.Lock()
	if q.take(g, limit) { // another task grew it meanwhile
		q.mu.Unlock()
		return func() { q.release(subject, g) }, true, nil
	}
	q.mu.Unlock()
	grown, err := q.growGrant(ctx, subject, g, limit)
	if err != nil {
		return nil, false, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !grown || !q.take(g, limit) {
		metrics.QuotaWaits.WithLabelValues(q.name).Inc()
		return nil, false, nil
	}
	return func() { q.release(subject, g) }, true, nil
}

// take uses one held slot if one is free and the limit (which may have been
// lowered) allows; q.mu is held. It starts the timer that gives unused slots
// back.
func (q *Quota) take(g *grant, limit int) bool {
	if g.lease != q.lease() {
		g.held, g.inUse, g.lease = 0, 0, q.lease() // a new lease: the old grant went with the old one
	}
	if g.inUse >= min(g.held, limit) {
		return false
	}
	g.inUse++
	g.peak = max(g.peak, g.inUse)
	return true
}

// growGrant asks the fleet for more slots of subject: it reads every grant
// and the ledger, and raises this worker's grant by up to a batch if the
// grants leave room, in a transaction that fails if any grant grew since the
// read. g.grow is held.
func (q *Quota) growGrant(ctx context.Context, subject string, g *grant, limit int) (bool, error) {
	pre := q.keys.QuotaGrants(q.name, subject)
	ledger := q.keys.QuotaLedger(q.name, subject)
	lease := q.lease()
	mine := q.keys.QuotaGrant(q.name, subject, int64(lease))
	batch := max(1, min(limit/4, 16))
	for {
		began := time.Now()
		resp, err := q.cli.Txn(ctx).Then(clientv3.OpGet(pre, clientv3.WithPrefix()), clientv3.OpGet(ledger)).Commit()
		if err != nil {
			return false, fmt.Errorf("flow: quota %s: %w", q.name, err)
		}
		sum, own := 0, 0
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			n, _ := strconv.Atoi(string(kv.Value))
			sum += n
			if string(kv.Key) == mine {
				own = n
			}
		}
		var ledgerRev int64
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
			ledgerRev = kvs[0].ModRevision
		}
		free := limit - sum
		if free <= 0 {
			metrics.ObserveTxn("quota", began)
			return false, nil
		}
		next := own + min(free, batch)
		tr, err := q.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ledger), "=", ledgerRev)).
			Then(clientv3.OpPut(ledger, ""), clientv3.OpPut(mine, strconv.Itoa(next), clientv3.WithLease(lease))).Commit()
		metrics.ObserveTxn("quota", began)
		if err != nil {
			return false, fmt.Errorf("flow: quota %s: %w", q.name, err)
		}
		if tr.Succeeded {
			q.mu.Lock()
			g.held, g.lease = next, lease
			q.mu.Unlock()
			return true, nil
		}
	}
}

// release frees a slot. Every grantIdle while this worker holds more slots
// than it uses, it gives back those it did not need in that time.
func (q *Quota) release(subject string, g *grant) {
	q.mu.Lock()
	defer q.mu.Unlock()
	g.inUse = max(0, g.inUse-1)
	if g.inUse < g.held && g.timer == nil {
		g.timer = time.AfterFunc(grantIdle, func() { q.shrink(subject, g) })
	}
}

// shrink gives back the slots g has not used since the last shrink (beyond
// its peak use in that window), so a busy worker keeps what it needs and an
// idle one returns everything within two windows. The local count is
// lowered before etcd's, so this worker never runs more tasks than etcd
// records for it, whatever happens to the request.
func (q *Quota) shrink(subject string, g *grant) {
	g.grow.Lock()
	defer g.grow.Unlock()
	q.mu.Lock()
	g.timer = nil
	keep, lease := max(g.peak, g.inUse), g.lease
	g.peak = g.inUse
	if g.inUse < g.held {
		g.timer = time.AfterFunc(grantIdle, func() { q.shrink(subject, g) })
	}
	if keep >= g.held || lease != q.lease() {
		q.mu.Unlock()
		return
	}
	g.held = keep
	q.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := q.keys.QuotaGrant(q.name, subject, int64(lease))
	var err error
	if keep == 0 {
		_, err = q.cli.Delete(ctx, key)
	} else {
		_, err = q.cli.Put(ctx, key, strconv.Itoa(keep), clientv3.WithLease(lease))
	}
	if err != nil {
		// etcd still counts the old grant for this worker: the fleet is
		// short of slots until the next shrink or the lease's end, never
		// over.
		q.logger.Warn("flow: could not give quota slots back", "quota", q.name, "subject", subject, "err", err)
	}
}

// Close stops following the quota's configuration and gives back every
// slot this process holds (running tasks should have ended), with ctx
// bounding the writes; slots it could not give back go with the lease. It
// is safe to call more than once.
func (q *Quota) Close(ctx context.Context) error {
	q.stop()
	select {
	case <-q.done:
	case <-ctx.Done():
		return fmt.Errorf("flow: close quota %s: %w", q.name, ctx.Err())
	}
	q.mu.Lock()
	grants := q.grants
	q.grants = map[string]*grant{}
	q.mu.Unlock()
	var first error
	for subject, g := range grants {
		g.grow.Lock()
		q.mu.Lock()
		if g.timer != nil {
			g.timer.Stop()
			g.timer = nil
		}
		lease := g.lease
		g.held = 0
		q.mu.Unlock()
		if lease != 0 {
			if _, err := q.cli.Delete(ctx, q.keys.QuotaGrant(q.name, subject, int64(lease))); err != nil && first == nil {
				first = fmt.Errorf("flow: close quota %s: give back slots of %s: %w", q.name, subject, err)
			}
		}
		g.grow.Unlock()
	}
	return first
}

// QuotaGate admits a call once it holds a slot of q, and frees the slot
// when the call ends, whatever its outcome. A call over quota is deferred
// for about a second (jittered; a queued task is not charged a retry).
func QuotaGate(q *Quota) Gate { return quotaGate{q} }

type quotaGate struct{ q *Quota }

func (g quotaGate) Admit(ctx context.Context, c Call) (func(error), error) {
	release, ok, err := g.q.Acquire(ctx, c)
	if err != nil {
		return nil, err
	}
	if !ok {
		after := 500*time.Millisecond + rand.N(time.Second)
		return nil, &DeferError{Reason: g.q.fullReason, After: after}
	}
	if release == nil {
		return nil, nil
	}
	return func(error) { release() }, nil
}

// QuotaUsage is a quota's configuration and how many slots workers hold, by
// subject (granted: running, or kept for grantIdle after a task ended).
type QuotaUsage struct {
	Name string `json:"name"`
	QuotaConfig
	Held map[string]int `json:"held"`
}

// Quotas lists every configured quota with its held slots.
func Quotas(ctx context.Context, cli *clientv3.Client, ns string) ([]QuotaUsage, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	g, err := cli.Get(ctx, keys.Quotas(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("flow: list quotas: %w", err)
	}
	byName := map[string]*QuotaUsage{}
	var names []string
	for _, kv := range g.Kvs {
		name, tail, ok := keyspace.SplitName(keys.Quotas(), string(kv.Key))
		if !ok {
			continue
		}
		u := byName[name]
		if u == nil {
			u = &QuotaUsage{Name: name, Held: map[string]int{}}
			byName[name] = u
			names = append(names, name)
		}
		if tail == keyspace.ConfigPart {
			_ = json.Unmarshal(kv.Value, &u.QuotaConfig)
			continue
		}
		if subject, ok := keyspace.GrantSubject(tail); ok {
			n, _ := strconv.Atoi(string(kv.Value))
			u.Held[subject] += n
		}
	}
	slices.Sort(names)
	out := make([]QuotaUsage, 0, len(names))
	for _, n := range names {
		out = append(out, *byName[n])
	}
	return out, nil
}
