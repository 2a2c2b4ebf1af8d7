package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/kv"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
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

// Quota is a fleet-wide concurrency quota: at most Limit tasks hold a slot
// at once, per tenant (quota "tenant"), per task type (quota "type"), or in
// total for a named resource. A slot is a key bound to the holding worker's
// lease, so a dead worker's slots free themselves when its lease expires.
//
// Taking a slot is one transaction: write the slot key, then read the first
// Limit slots by creation revision; the slot is held if it is among them,
// and otherwise deleted at once. No more than Limit can ever hold: of any
// Limit+1 holders, the newest would have seen the Limit older ones when it
// read. A refused task is deferred (handed back to the queue for about a
// second, its attempt not counted), so it waits in the queue, not in a
// worker slot that other tenants could use.
type Quota struct {
	cli    *clientv3.Client
	keys   keyspace.Space
	name   string
	types  []string
	lease  func() clientv3.LeaseID
	logger *slog.Logger

	mu  sync.Mutex
	cfg QuotaConfig

	stop context.CancelFunc
	done chan struct{}
}

// NewQuota returns a handle on quota name whose slots are bound to the lease
// that lease returns (the worker's). def, when it sets any limit, configures
// the quota if nobody has; etcd's configuration wins otherwise and changes
// are followed live. types, when given, limits the quota to tasks of those
// types.
func NewQuota(ctx context.Context, cli *clientv3.Client, keys keyspace.Space, name string, def QuotaConfig, lease func() clientv3.LeaseID, types ...string) (*Quota, error) {
	if err := keyspace.CheckName("quota name", name); err != nil {
		return nil, err
	}
	q := &Quota{cli: cli, keys: keys, name: name, types: types, lease: lease, logger: slog.Default(), done: make(chan struct{})}
	if def.Limit > 0 || len(def.Subjects) > 0 {
		if err := def.Check("quota"); err != nil {
			return nil, err
		}
		b, _ := json.Marshal(def)
		if _, err := kv.Create(ctx, cli, keys.QuotaConfig(name), b, 0); err != nil && !errors.Is(err, kv.ErrExists) {
			return nil, fmt.Errorf("flow: configure quota %s: %w", name, err)
		}
	}
	cfg, rev, err := GetQuota(ctx, cli, keys, name)
	if err != nil {
		return nil, err
	}
	q.cfg = cfg
	wctx, cancel := context.WithCancel(context.Background())
	q.stop = cancel
	go func() {
		defer close(q.done)
		followKey(wctx, cli, keys.QuotaConfig(name), rev, func(v []byte) {
			var c QuotaConfig
			if json.Unmarshal(v, &c) == nil {
				q.mu.Lock()
				q.cfg = c
				q.mu.Unlock()
			}
		})
	}()
	return q, nil
}

// GetQuota reads quota name's configuration and the revision it was read at.
func GetQuota(ctx context.Context, cli *clientv3.Client, keys keyspace.Space, name string) (QuotaConfig, int64, error) {
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
func SetQuota(ctx context.Context, cli *clientv3.Client, keys keyspace.Space, name, subject string, limit int) error {
	if err := keyspace.CheckName("quota name", name); err != nil {
		return err
	}
	if limit != 0 || subject == "" {
		if err := CheckQuotaLimit("limit", limit); err != nil {
			return err
		}
	}
	key := keys.QuotaConfig(name)
	for {
		g, err := cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("flow: set quota %s: %w", name, err)
		}
		var c QuotaConfig
		var mod int64
		if len(g.Kvs) == 1 {
			_ = json.Unmarshal(g.Kvs[0].Value, &c)
			mod = g.Kvs[0].ModRevision
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
		b, _ := json.Marshal(c)
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).Then(clientv3.OpPut(key, string(b))).Commit()
		if err != nil {
			return fmt.Errorf("flow: set quota %s: %w", name, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
}

// Config returns the quota's current configuration.
func (q *Quota) Config() QuotaConfig {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cfg
}

// subject is the slot group t counts in, "" when the quota does not apply.
func (q *Quota) subject(t *queue.Task) string {
	if len(q.types) > 0 && !slices.Contains(q.types, t.Type) {
		return ""
	}
	switch q.name {
	case PerTenant:
		if t.Metadata.Tenant == "" {
			return ""
		}
		return url.PathEscape(t.Metadata.Tenant)
	case PerType:
		return t.Type
	}
	return "-"
}

// Acquire takes a slot for t. It returns release (nil when the quota does
// not apply to t) and whether the slot was granted.
func (q *Quota) Acquire(ctx context.Context, t *queue.Task) (release func(), ok bool, err error) {
	subject := q.subject(t)
	if subject == "" {
		return nil, true, nil
	}
	limit := q.Config().For(subject)
	if limit <= 0 {
		return nil, true, nil
	}
	lease := q.lease()
	pre := q.keys.QuotaSlots(q.name, subject)
	key := fmt.Sprintf("%s%x-%s", pre, int64(lease), t.ID)
	began := time.Now()
	resp, err := q.cli.Txn(ctx).Then(
		clientv3.OpPut(key, t.ID, clientv3.WithLease(lease)),
		clientv3.OpGet(pre, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(limit)),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
	).Commit()
	metrics.ObserveTxn("quota", began)
	if err != nil {
		return nil, false, fmt.Errorf("flow: quota %s: %w", q.name, err)
	}
	del := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := q.cli.Delete(dctx, key); err != nil {
			q.logger.Warn("flow: could not free a quota slot; it goes with the worker's lease", "quota", q.name, "key", key, "err", err)
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if string(kv.Key) == key {
			return del, true, nil
		}
	}
	del()
	metrics.QuotaWaits.WithLabelValues(q.name).Inc()
	return nil, false, nil
}

// Close stops following the quota's configuration.
func (q *Quota) Close() {
	q.stop()
	<-q.done
}

// QuotaGate admits a task once it holds a slot of q, and frees the slot when
// its handler returns. A task over quota is deferred for about a second
// (jittered), not charged a retry.
func QuotaGate(q *Quota) queue.Gate { return quotaGate{q} }

type quotaGate struct{ q *Quota }

func (g quotaGate) Admit(ctx context.Context, t *queue.Task) (func(error), error) {
	release, ok, err := g.q.Acquire(ctx, t)
	if err != nil {
		return nil, err
	}
	if !ok {
		after := 500*time.Millisecond + rand.N(time.Second)
		return nil, &queue.DeferError{Reason: "quota " + g.q.name + " full", After: after}
	}
	if release == nil {
		return func(error) {}, nil
	}
	return func(error) { release() }, nil
}

// QuotaUsage is a quota's configuration and how many slots are held, by
// subject.
type QuotaUsage struct {
	Name string `json:"name"`
	QuotaConfig
	Held map[string]int `json:"held"`
}

// Quotas lists every configured quota with its held slots.
func Quotas(ctx context.Context, cli *clientv3.Client, keys keyspace.Space) ([]QuotaUsage, error) {
	g, err := cli.Get(ctx, keys.Quotas(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("flow: list quotas: %w", err)
	}
	byName := map[string]*QuotaUsage{}
	var names []string
	for _, kv := range g.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), keys.Quotas())
		name, tail, _ := strings.Cut(rest, "/")
		u := byName[name]
		if u == nil {
			u = &QuotaUsage{Name: name, Held: map[string]int{}}
			byName[name] = u
			names = append(names, name)
		}
		if tail == "config" {
			u.QuotaConfig, _, _ = GetQuota(ctx, cli, keys, name)
			continue
		}
		if sub, ok := strings.CutPrefix(tail, "slots/"); ok {
			subject, _, _ := strings.Cut(sub, "/")
			if s, err := url.PathUnescape(subject); err == nil {
				subject = s
			}
			u.Held[subject]++
		}
	}
	slices.Sort(names)
	out := make([]QuotaUsage, 0, len(names))
	for _, n := range names {
		out = append(out, *byName[n])
	}
	return out, nil
}
