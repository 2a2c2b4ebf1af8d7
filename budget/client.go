package budget

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/groupcommit"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Client reserves and settles budgets of one namespace, and administers
// them. Its reservations are bound, unless a ReserveOption says otherwise,
// to one session lease of its own that it keeps alive: when the process
// dies, they are released when that lease ends.
type Client struct {
	cli  *clientv3.Client
	keys keyspace.Space
	ttl  int
	now  func() time.Time

	mu      sync.Mutex
	session *concurrency.Session
	closed  bool
	lines   map[string]*groupcommit.Line[*call] // each budget's writers in this process (batch.go)
	cache   map[string]view                     // each budget as this client last read or wrote it
}

// errClosed is the error of a reservation through a closed client.
var errClosed = errors.New("budget: client closed")

// Option changes a Client.
type Option func(*Client)

// WithSessionTTL sets the TTL in seconds of the client's session lease
// (default 10): how long an unsettled reservation of a dead process stays.
func WithSessionTTL(seconds int) Option { return func(c *Client) { c.ttl = seconds } }

// WithClock sets the clock that places reservations in windows (default
// time.Now); tests move it by hand.
func WithClock(now func() time.Time) Option { return func(c *Client) { c.now = now } }

// New returns a client of namespace ns ("" is the default namespace). It
// panics on a namespace keyspace refuses; use keyspace.CheckName first for
// a name from outside.
func New(cli *clientv3.Client, ns string, opts ...Option) *Client {
	c := &Client{cli: cli, keys: keyspace.MustNew(ns), ttl: 10, now: time.Now, lines: map[string]*groupcommit.Line[*call]{}, cache: map[string]view{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Close ends the client's session lease, which releases the reservations
// made under it that are not settled yet; reservations through the client
// fail from then on, whatever their lease. Safe to call twice.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.session == nil {
		return nil
	}
	err := c.session.Close()
	c.session = nil
	return err
}

// lease returns the client's session lease, granted on first use.
func (c *Client) lease(ctx context.Context) (clientv3.LeaseID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errClosed
	}
	if c.session != nil {
		select {
		case <-c.session.Done(): // lost (etcd unreachable past the TTL): a new one
			c.session = nil
		default:
			return c.session.Lease(), nil
		}
	}
	s, err := concurrency.NewSession(c.cli, concurrency.WithTTL(c.ttl), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return 0, fmt.Errorf("budget: grant the session lease: %w", err)
	}
	c.session = s
	return s.Lease(), nil
}

// view returns budget key as this client last read or wrote it, or reads
// it (cached: it came from the cache). A cached view saves the read: the
// write's compare-and-swap finds it out of date if anyone wrote since.
func (c *Client) view(ctx context.Context, key string) (view, bool, error) {
	c.mu.Lock()
	v, ok := c.cache[key]
	c.mu.Unlock()
	if ok {
		return v, true, nil
	}
	v, err := c.refresh(ctx, key)
	return v, false, err
}

// refresh reads budget key and caches what it read.
func (c *Client) refresh(ctx context.Context, key string) (view, error) {
	v, err := c.read(ctx, key)
	if err != nil {
		c.forget(key)
		if errors.Is(err, ErrNoBudget) { // nor its line: keys nobody configured do not pile up
			c.mu.Lock()
			delete(c.lines, key)
			c.mu.Unlock()
		}
		return view{}, err
	}
	c.remember(key, v)
	return v, nil
}

func (c *Client) remember(key string, v view) {
	c.mu.Lock()
	c.cache[key] = v
	c.mu.Unlock()
}

func (c *Client) forget(key string) {
	c.mu.Lock()
	delete(c.cache, key)
	c.mu.Unlock()
}

// Reservation is tokens of a budget held for one call until it is settled
// or its lease ends.
type Reservation struct {
	ID     string `json:"id" doc:"The reservation's id: settle it with this."`
	Budget string `json:"budget" doc:"The budget's key."`
	Tenant string `json:"tenant" doc:"Whom the call is for."`
	// TaskType is the task type it was made for (WithTaskType), if any.
	TaskType string `json:"task_type,omitempty" doc:"The task type it was made for, if any: an estimate of 0 took the budget's default for that type."`
	// Estimate is the tokens held.
	Estimate int64 `json:"estimate" doc:"Tokens held."`
	// Window is the index of the window the tokens belong to (unix seconds
	// / the window's length).
	Window int64 `json:"window" doc:"The window the tokens belong to: unix seconds divided by the window's length."`
	// Bound is the most tokens its settle may report: the budget's tokens
	// per window when it was made (MaxTokens when tokens are not limited).
	Bound int64 `json:"settle_bound" doc:"The most tokens its settle may report."`
	// Lease is the etcd lease the reservation lives under, in hex.
	Lease string `json:"lease" doc:"The etcd lease it lives under, in hex: when it ends unsettled, the reservation is released."`
	// OwnLease: the lease was granted for this reservation alone (WithTTL),
	// and Settle revokes it.
	OwnLease bool `json:"own_lease" doc:"The lease was granted for this reservation alone; settling revokes it."`
	// ReservedAt is when it was made, by the reserving client's clock.
	ReservedAt time.Time `json:"reserved_at" doc:"When it was made."`
	// ExpiresAt is when its own lease (WithTTL) ends, by the reserving
	// client's clock: a guide only. Whether the lease ended is etcd's to
	// say; a settle after it did is ErrNotReserved and counts nothing.
	// Zero for a reservation under a session's or a worker's lease.
	ExpiresAt time.Time `json:"expires_at,omitzero" doc:"When its own lease ends (reservations made over HTTP), by the reserving server's clock: once etcd has ended the lease, a settle is refused (409) and counts nothing."`
	// Requests is the requests it holds when above 1: a block a worker
	// reserved for many calls at once (WithBlock).
	Requests int64 `json:"requests,omitempty" doc:"The requests it holds when more than one: a block a Go worker reserved ahead for many tasks."`

	// As the reserve found the budget (not stored): when its window ends
	// by the reserving clock, and what was left after it.
	windowEnd                time.Time
	roomTokens, roomRequests int64
}

// ReserveOption changes one Reserve.
type ReserveOption func(*reserveOpts)

type reserveOpts struct {
	// block: requests held at once (WithBlock; 0: one).
	block    int64
	lease    clientv3.LeaseID
	ttl      int64
	taskType string
	// needEstimate: no estimate was given (HTTP), so the task type's
	// default must exist.
	needEstimate bool
}

// refuse returns the InputError for a reservation of estimate cfg must
// refuse whatever its usage: no estimate at all, or one it could never
// admit.
func (o reserveOpts) refuse(cfg Budget, tenant string, estimate int64) error {
	if _, ok := cfg.Estimates[o.taskType]; o.needEstimate && estimate == 0 && (o.taskType == "" || !ok) {
		return &drover.InputError{Field: "estimate", Value: nil,
			Rule: "is required unless task_type names a type with a default estimate in the budget"}
	}
	return unwaitable(cfg, tenant, cfg.estimateFor(estimate, o.taskType))
}

// WithTaskType names the task type the reservation is for: with an
// estimate of 0, the reservation holds the budget's default estimate for
// that type (Budget.Estimates), and 0 when it names none.
func WithTaskType(taskType string) ReserveOption {
	return func(o *reserveOpts) { o.taskType = taskType }
}

// WithLease binds the reservation to lease (a worker's own lease) instead
// of the client's session.
func WithLease(lease clientv3.LeaseID) ReserveOption {
	return func(o *reserveOpts) { o.lease = lease }
}

// WithTTL binds the reservation to a lease of its own, granted for seconds
// and not kept alive: a caller that does not settle within that time loses
// it. The HTTP API reserves this way.
func WithTTL(seconds int64) ReserveOption { return func(o *reserveOpts) { o.ttl = seconds } }

// MaxTTL is the longest WithTTL.
const MaxTTL = 3600

// maxTries bounds the compare-and-swap retries of one call.
const maxTries = 200

// Reserve holds estimate tokens (and one request) of budget key for tenant.
// It returns a *drover.DeferError when the budget, the tenant's cap or the
// tenant's fair share has no room in this window (After: until the window
// turns), ErrNoBudget for a key not configured, and an InputError for an
// estimate below 0 or above the budget's tokens per window or the tenant's
// cap, which could never be admitted. Nothing is written on an error, except that a refused
// tenant is marked as asking, with the estimate it was refused, so that
// its share (or that estimate) is set aside from now on.
func (c *Client) Reserve(ctx context.Context, key, tenant string, estimate int64, opts ...ReserveOption) (Reservation, error) {
	var o reserveOpts
	for _, f := range opts {
		f(&o)
	}
	if err := c.checkReserve(key, tenant, estimate, o); err != nil {
		return Reservation{}, err
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed { // whatever lease the reservation would live under
		return Reservation{}, errClosed
	}
	// An estimate the budget could never admit, or a budget not
	// configured, is refused before a lease is granted for it.
	v, cached, err := c.view(ctx, key)
	if err != nil {
		return Reservation{}, err
	}
	if o.refuse(v.cfg, tenant, estimate) != nil && cached { // the configuration may have changed
		if v, err = c.refresh(ctx, key); err != nil {
			return Reservation{}, err
		}
	}
	if err := o.refuse(v.cfg, tenant, estimate); err != nil {
		return Reservation{}, err
	}
	lease, own, err := c.leaseFor(ctx, o)
	if err != nil {
		return Reservation{}, err
	}
	o.lease = lease
	k := &call{r: Reservation{ID: newID(), Budget: key, Tenant: tenant, TaskType: o.taskType, Lease: fmt.Sprintf("%x", int64(lease)), OwnLease: own},
		estimate: estimate, opts: o}
	err = c.submit(ctx, key, k) // ctx's error: it left the line unsent
	if err == nil {
		err = k.err
	}
	if err != nil {
		if own {
			c.revoke(lease)
		}
		if k.refused {
			metrics.BudgetReservations.WithLabelValues(key, "refused").Inc()
		}
		return Reservation{}, err
	}
	metrics.BudgetReservations.WithLabelValues(key, "admitted").Inc()
	return k.res, nil
}

// current returns the reservations of res made in window w or later: the
// cache forgets older ones when the window turns (they no longer count, a
// settle of one reads the budget again, and one whose lease ended would
// otherwise stay in the cache for good).
func current(res []Reservation, w int64) []Reservation {
	out := make([]Reservation, 0, len(res)+1)
	for _, r := range res {
		if r.Window >= w {
			out = append(out, r)
		}
	}
	return out
}

// checkReserve checks a reservation's input before anything is read.
func (c *Client) checkReserve(key, tenant string, estimate int64, o reserveOpts) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if err := CheckTenant("tenant", tenant); err != nil {
		return err
	}
	if estimate < 0 || estimate > MaxTokens {
		return &drover.InputError{Field: "estimate", Value: estimate, Rule: fmt.Sprintf("must be between 0 and %d tokens", MaxTokens)}
	}
	if o.taskType != "" {
		if err := keyspace.CheckName("task_type", o.taskType); err != nil {
			return err
		}
	}
	if o.block < 0 || o.block > MaxBlock {
		return &drover.InputError{Field: "block", Value: o.block, Rule: fmt.Sprintf("must be between 1 and %d requests", MaxBlock)}
	}
	if o.ttl != 0 && (o.ttl < 1 || o.ttl > MaxTTL) {
		return &drover.InputError{Field: "ttl", Value: o.ttl, Rule: fmt.Sprintf("must be between 1 and %d seconds", MaxTTL)}
	}
	return nil
}

// unwaitable returns an InputError for an estimate cfg could never admit:
// above its tokens per window or above tenant's cap.
func unwaitable(cfg Budget, tenant string, estimate int64) error {
	if cfg.Tokens > 0 && estimate > cfg.Tokens {
		return &drover.InputError{Field: "estimate", Value: estimate,
			Rule: fmt.Sprintf("must not exceed the budget's %d tokens per window: it could never be admitted", cfg.Tokens)}
	}
	if c, ok := cfg.Caps[tenant]; ok && estimate > c {
		return &drover.InputError{Field: "estimate", Value: estimate,
			Rule: fmt.Sprintf("must not exceed tenant %q's cap of %d tokens per window: it could never be admitted", tenant, c)}
	}
	return nil
}

// leaseFor returns the lease a reservation lives under, and whether it was
// granted for it alone.
func (c *Client) leaseFor(ctx context.Context, o reserveOpts) (clientv3.LeaseID, bool, error) {
	switch {
	case o.lease != 0:
		return o.lease, false, nil
	case o.ttl > 0:
		g, err := c.cli.Grant(ctx, o.ttl)
		if err != nil {
			return 0, false, fmt.Errorf("budget: grant the reservation's lease: %w", err)
		}
		return g.ID, true, nil
	}
	id, err := c.lease(ctx)
	return id, false, err
}

// revoke ends a lease granted for one reservation, best effort: one that
// is not revoked ends at its TTL anyway.
func (c *Client) revoke(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = c.cli.Revoke(ctx, lease)
}

func cloneTenants(m map[string]*tenantState) map[string]*tenantState {
	out := make(map[string]*tenantState, len(m))
	for t, ts := range m {
		c := *ts
		out[t] = &c
	}
	return out
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
