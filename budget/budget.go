package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	// ErrNoBudget is returned for a budget key that has no configuration.
	ErrNoBudget = errors.New("budget: not configured")
	// ErrNotReserved is returned when settling a reservation that does not
	// exist: unknown, already settled, or released when its lease ended.
	ErrNotReserved = errors.New("budget: reservation not held")
)

// Bounds of a budget's configuration and of what work reserves.
const (
	// MaxTokens is the most tokens or requests a budget allows per window,
	// and the most a reservation estimates or a settle reports.
	MaxTokens = 1_000_000_000
	// MaxWindowSeconds is the longest window: a day.
	MaxWindowSeconds = 86400
	// MaxWeight is the largest tenant weight.
	MaxWeight = 1000
	// MaxKeyLen is the longest budget key.
	MaxKeyLen = 256
	// MaxTenantLen is the longest tenant name.
	MaxTenantLen = 128
	// MaxTenants is the most tenants a budget names in caps and weights.
	MaxTenants = 1000
	// MaxEstimates is the most task types a budget gives default
	// estimates for.
	MaxEstimates = 1000
	// MaxActiveTenants is the most tenants a budget tracks at once (those
	// that asked in its current window or the last): its counters are one
	// etcd value, which this keeps to a few hundred KiB. A further tenant
	// is deferred until the window turns.
	MaxActiveTenants = 2000
)

// Budget is a budget's configuration: at most Requests requests and Tokens
// tokens per window of WindowSeconds (0: that dimension is not limited; at
// least one must be set), shared between tenants.
type Budget struct {
	// Key names the budget, usually provider/model/key-name, where
	// key-name is a NAME you give the API key (key-prod), never the API
	// key itself: budget keys are stored, listed and logged in clear.
	Key string `json:"key" doc:"The budget's key: provider/model/key-name, such as openai/gpt-4.1/key-prod. key-name names the API key; never put the API key itself here: budget keys are stored, listed and logged in clear."`
	// Requests is the most reservations per window (0: no limit).
	Requests int64 `json:"requests" doc:"The most reservations per window (0: no limit)."`
	// Tokens is the most tokens reserved or used per window (0: no limit).
	Tokens int64 `json:"tokens" doc:"The most tokens reserved or used per window (0: no limit)."`
	// WindowSeconds is the window's length (default 60).
	WindowSeconds int64 `json:"window_seconds" doc:"The window's length in seconds."`
	// Caps is the most tokens a tenant may take per window.
	Caps map[string]int64 `json:"caps,omitempty" doc:"The most tokens a tenant may take per window, by tenant."`
	// Weights divide Tokens between the tenants that ask at once; a tenant
	// not named here weighs 1.
	Weights map[string]float64 `json:"weights,omitempty" doc:"Tenants' weights; a tenant not named weighs 1."`
	// Estimates are default estimates by task type: a reservation that
	// gives no estimate (0) and names its task type (WithTaskType; a
	// queue task that names this budget without estimated_tokens) holds
	// its type's estimate here (0 for a type not named).
	Estimates map[string]int64 `json:"estimates,omitempty" doc:"Default estimates by task type: a reservation (or queue task) that gives no estimate and names its task type holds its type's estimate."`
}

// weight returns tenant's weight.
func (b Budget) weight(tenant string) float64 {
	if w, ok := b.Weights[tenant]; ok {
		return w
	}
	return 1
}

// Validate returns an InputError for the first field out of its range.
func (b Budget) Validate() error {
	if err := CheckKey(b.Key); err != nil {
		return err
	}
	if b.Requests < 0 || b.Requests > MaxTokens {
		return &drover.InputError{Field: "requests", Value: b.Requests, Rule: fmt.Sprintf("must be between 0 (no limit) and %d", MaxTokens)}
	}
	if b.Tokens < 0 || b.Tokens > MaxTokens {
		return &drover.InputError{Field: "tokens", Value: b.Tokens, Rule: fmt.Sprintf("must be between 0 (no limit) and %d", MaxTokens)}
	}
	if b.Requests == 0 && b.Tokens == 0 {
		return &drover.InputError{Field: "tokens", Value: 0, Rule: "a budget limits requests, tokens or both: set at least one above 0"}
	}
	if b.WindowSeconds < 1 || b.WindowSeconds > MaxWindowSeconds {
		return &drover.InputError{Field: "window_seconds", Value: b.WindowSeconds, Rule: fmt.Sprintf("must be between 1 and %d", MaxWindowSeconds)}
	}
	if len(b.Caps)+len(b.Weights) > MaxTenants {
		return &drover.InputError{Field: "caps", Value: len(b.Caps) + len(b.Weights), Rule: fmt.Sprintf("caps and weights name at most %d tenants together", MaxTenants)}
	}
	for _, t := range slices.Sorted(maps.Keys(b.Caps)) {
		if err := CheckTenant("caps", t); err != nil {
			return err
		}
		if c := b.Caps[t]; c < 1 || c > MaxTokens || (b.Tokens > 0 && c > b.Tokens) {
			return &drover.InputError{Field: "caps " + t, Value: c, Rule: "must be at least 1 and at most the budget's tokens per window"}
		}
	}
	for _, t := range slices.Sorted(maps.Keys(b.Weights)) {
		if err := CheckTenant("weights", t); err != nil {
			return err
		}
		// !(w > 0) also refuses NaN.
		if w := b.Weights[t]; !(w > 0) || w > MaxWeight {
			return &drover.InputError{Field: "weights " + t, Value: w, Rule: fmt.Sprintf("must be above 0 and at most %d", MaxWeight)}
		}
	}
	return b.validateEstimates()
}

// validateEstimates checks the default estimates by task type.
func (b Budget) validateEstimates() error {
	if len(b.Estimates) > MaxEstimates {
		return &drover.InputError{Field: "estimates", Value: len(b.Estimates), Rule: fmt.Sprintf("name at most %d task types", MaxEstimates)}
	}
	most := int64(MaxTokens)
	if b.Tokens > 0 {
		most = b.Tokens
	}
	for _, tt := range slices.Sorted(maps.Keys(b.Estimates)) {
		if keyspace.CheckName("estimates", tt) != nil {
			return &drover.InputError{Field: "estimates", Value: tt, Rule: "must be keyed by task types: " + keyspace.NameRule}
		}
		if e := b.Estimates[tt]; e < 1 || e > most {
			return &drover.InputError{Field: "estimates " + tt, Value: e, Rule: fmt.Sprintf("must be at least 1 and at most %d, the budget's tokens per window", most)}
		}
	}
	return nil
}

// estimateFor is the estimate of a reservation that gave est for task
// type tt: est, or when est is 0 the budget's default for tt.
func (b Budget) estimateFor(est int64, tt string) int64 {
	if est == 0 && tt != "" {
		return b.Estimates[tt]
	}
	return est
}

// CheckKey returns an InputError unless key is a usable budget key.
func CheckKey(key string) error { return keyspace.CheckBudgetKey("key", key) }

// CheckTenant returns an InputError unless tenant is at most MaxTenantLen
// bytes of printable text ("" is the tenant of work that names none).
func CheckTenant(field, tenant string) error {
	if len(tenant) > MaxTenantLen || strings.ContainsFunc(tenant, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return &drover.InputError{Field: field, Value: tenant, Rule: fmt.Sprintf("a tenant must be at most %d bytes without control characters", MaxTenantLen)}
	}
	return nil
}

// withDefaults fills the zero window.
func (b Budget) withDefaults() Budget {
	if b.WindowSeconds == 0 {
		b.WindowSeconds = 60
	}
	return b
}

// Set creates or replaces budget b.Key's configuration. The window's
// counters and live reservations stay: a smaller budget refuses new work
// until usage falls under it. It returns the configuration written.
func (c *Client) Set(ctx context.Context, b Budget) (Budget, error) {
	b = b.withDefaults()
	if err := b.Validate(); err != nil {
		return Budget{}, err
	}
	v, _ := json.Marshal(b)
	c.forget(b.Key)
	if _, err := c.cli.Put(ctx, c.keys.BudgetConfig(b.Key), string(v)); err != nil {
		return Budget{}, fmt.Errorf("budget: set %s: %w", b.Key, err)
	}
	return b, nil
}

// Get returns budget key with its usage now.
func (c *Client) Get(ctx context.Context, key string) (Usage, error) {
	if err := CheckKey(key); err != nil {
		return Usage{}, err
	}
	v, err := c.read(ctx, key)
	if err != nil {
		return Usage{}, err
	}
	return v.status(c.now()), nil
}

// List returns every budget of the namespace by key, with its usage now.
// Reservations are counted, not read: Live is each budget's number of
// live reservations, Reserved is 0 in the list's entries (Get sums them).
func (c *Client) List(ctx context.Context) ([]Usage, error) {
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.keys.BudgetConfigs(), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.BudgetStates(), clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, fmt.Errorf("budget: list: %w", err)
	}
	states := map[string][]byte{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if key, ok := keyspace.BudgetOf(c.keys.BudgetStates(), string(kv.Key)); ok {
			states[key] = kv.Value
		}
	}
	now := c.now()
	out := []Usage{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		key, ok := keyspace.BudgetOf(c.keys.BudgetConfigs(), string(kv.Key))
		if !ok {
			continue
		}
		v := view{}
		if err := json.Unmarshal(kv.Value, &v.cfg); err != nil {
			return nil, fmt.Errorf("budget: %s has an unreadable configuration: %w", key, err)
		}
		if st, ok := states[key]; ok {
			if err := json.Unmarshal(st, &v.st); err != nil {
				return nil, fmt.Errorf("budget: %s has unreadable counters: %w", key, err)
			}
		}
		out = append(out, v.status(now))
	}
	slices.SortFunc(out, func(a, b Usage) int { return strings.Compare(a.Key, b.Key) })
	return out, c.countLive(ctx, out)
}

// countBatch is the most count-only reads of one transaction (etcd
// allows 128 operations by default).
const countBatch = 100

// countLive sets each entry's Live to its budget's number of reservation
// keys: count-only reads, no reservation is sent.
func (c *Client) countLive(ctx context.Context, out []Usage) error {
	for lo := 0; lo < len(out); lo += countBatch {
		part := out[lo:min(lo+countBatch, len(out))]
		ops := make([]clientv3.Op, len(part))
		for i, u := range part {
			ops[i] = clientv3.OpGet(c.keys.BudgetReservations(u.Key), clientv3.WithPrefix(), clientv3.WithCountOnly())
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("budget: list: count reservations: %w", err)
		}
		for i := range part {
			part[i].Live = int(resp.Responses[i].GetResponseRange().Count)
		}
	}
	return nil
}

// Delete removes budget key: its configuration, counters and reservations,
// in one transaction. Settling a reservation of a deleted budget is
// ErrNotReserved. ErrNoBudget when it was not configured.
func (c *Client) Delete(ctx context.Context, key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	cfg := c.keys.BudgetConfig(key)
	c.forget(key)
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(cfg), ">", 0)).Then(
		clientv3.OpDelete(cfg), clientv3.OpDelete(c.keys.BudgetState(key)),
		clientv3.OpDelete(c.keys.BudgetReservations(key), clientv3.WithPrefix())).Commit()
	if err != nil {
		return fmt.Errorf("budget: delete %s: %w", key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s", ErrNoBudget, key)
	}
	return nil
}
