package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Provider headers a settle reads (OpenAI's names; others send the same).
const (
	HeaderRemainingTokens = "X-Ratelimit-Remaining-Tokens"
	HeaderResetTokens     = "X-Ratelimit-Reset-Tokens"
)

// Settlement is what a settle did.
type Settlement struct {
	ID       string `json:"id" doc:"The reservation's id."`
	Budget   string `json:"budget" doc:"The budget's key."`
	Tenant   string `json:"tenant" doc:"Whom the call was for."`
	Estimate int64  `json:"estimate" doc:"Tokens the reservation held."`
	Actual   int64  `json:"actual" doc:"Tokens the call used, now counted."`
	// Difference is Actual - Estimate: below 0 refunded, above 0 charged.
	Difference int64 `json:"difference" doc:"actual - estimate: below 0 refunded, above 0 charged."`
	// Corrected is the tokens the provider's headers said were gone beyond
	// drover's count, now counted as used until the provider's reset (0:
	// no correction).
	Corrected int64 `json:"corrected" doc:"Tokens the provider's headers said were gone beyond drover's count, now counted as used until the provider's reset."`
}

// Settle ends reservation r with the tokens the call actually used: its
// estimate is released and actual counted, so the difference is refunded
// or charged. A reservation made in an earlier window charges only what
// actual exceeds its estimate, to the current window. h, when it holds the
// provider's x-ratelimit-remaining-tokens (and x-ratelimit-reset-tokens),
// lowers what drover thinks is left to what the provider says is left,
// until the provider's reset or the window's end; it never raises it.
//
// ErrNotReserved when r is unknown, already settled or was released at
// its lease's end; an InputError when actual is below 0 or above
// r.Bound. Nothing is written on an error.
func (c *Client) Settle(ctx context.Context, r Reservation, actual int64, h http.Header) (Settlement, error) {
	if err := CheckKey(r.Budget); err != nil {
		return Settlement{}, err
	}
	if r.ID == "" || len(r.ID) > 64 || strings.ContainsAny(r.ID, "/%") {
		return Settlement{}, &drover.InputError{Field: "id", Value: r.ID, Rule: "must be a reservation id that Reserve returned"}
	}
	if actual < 0 || actual > MaxTokens {
		return Settlement{}, &drover.InputError{Field: "actual", Value: actual, Rule: fmt.Sprintf("must be between 0 and %d tokens", MaxTokens)}
	}
	remaining, reset, err := providerHeaders(h)
	if err != nil {
		return Settlement{}, err
	}
	k := &call{settle: true, id: r.ID, actual: actual, remaining: remaining, reset: reset, calls: -1}
	if err := c.submit(ctx, r.Budget, k); err != nil { // it left the line unsent
		return Settlement{}, err
	}
	if k.err != nil {
		return Settlement{}, k.err
	}
	metrics.BudgetTokensSettled.WithLabelValues(r.Budget).Add(float64(actual))
	if k.lease != "" {
		if lid, err := strconv.ParseInt(k.lease, 16, 64); err == nil {
			c.revoke(clientv3.LeaseID(lid))
		}
	}
	return k.out, nil
}

// leaseEnded asks etcd whether lease (in hex) has ended; an unreadable
// lease is judged by the settle's transaction alone.
func (c *Client) leaseEnded(ctx context.Context, lease string) (bool, error) {
	lid, err := strconv.ParseInt(lease, 16, 64)
	if err != nil {
		return false, nil
	}
	resp, err := c.cli.TimeToLive(ctx, clientv3.LeaseID(lid))
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return true, nil
		}
		return false, fmt.Errorf("budget: lease of a reservation: %w", err)
	}
	return resp.TTL <= 0, nil
}

// correct lowers what st leaves to remaining, the provider's count, until
// the provider's reset (reset; 0: the window's end). It returns the tokens
// added to the floor.
func (st *state) correct(cfg Budget, others []Reservation, remaining int64, reset time.Duration, now time.Time) int64 {
	reserved, _ := held(others, st.Window)
	ours := cfg.Tokens - st.Used - reserved - st.Floor
	if ours <= remaining {
		return 0
	}
	end := time.Unix((st.Window+1)*st.Len, 0)
	until := end
	if reset > 0 && now.Add(reset).Before(end) {
		until = now.Add(reset)
	}
	st.Floor += ours - remaining
	st.FloorUntil = max(st.FloorUntil, until.UnixMilli())
	return ours - remaining
}

// CheckProviderHeaders returns the InputError a settle would return for
// the provider's headers in h (x-ratelimit-remaining-tokens and
// x-ratelimit-reset-tokens), nil when they are usable or absent.
func CheckProviderHeaders(h http.Header) error {
	_, _, err := providerHeaders(h)
	return err
}

// providerHeaders reads the provider's remaining tokens (-1: not given) and
// reset delay (0: not given) from h.
func providerHeaders(h http.Header) (int64, time.Duration, error) {
	remaining := int64(-1)
	if s := h.Get(HeaderRemainingTokens); s != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n < 0 || n > MaxTokens {
			return 0, 0, &drover.InputError{Field: "headers " + strings.ToLower(HeaderRemainingTokens), Value: s, Rule: fmt.Sprintf("must be a whole number of tokens between 0 and %d", MaxTokens)}
		}
		remaining = n
	}
	var reset time.Duration
	if s := strings.TrimSpace(h.Get(HeaderResetTokens)); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil { // a bare number is seconds
			f, ferr := strconv.ParseFloat(s, 64)
			d, err = time.Duration(f*float64(time.Second)), ferr
		}
		if err != nil || d < 0 || d > MaxWindowSeconds*time.Second {
			return 0, 0, &drover.InputError{Field: "headers " + strings.ToLower(HeaderResetTokens), Value: s, Rule: "must be a duration such as 6m0s, 1.5s or 20ms, at most a day"}
		}
		reset = d
	}
	return remaining, reset, nil
}

// readOps are the reads of budget key: configuration, counters and
// reservations, in one transaction.
func (c *Client) readOps(key string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(c.keys.BudgetConfig(key)), clientv3.OpGet(c.keys.BudgetState(key)),
		clientv3.OpGet(c.keys.BudgetReservations(key), clientv3.WithPrefix())}
}

// read returns budget key as it stands: one round trip.
func (c *Client) read(ctx context.Context, key string) (view, error) {
	resp, err := c.cli.Txn(ctx).Then(c.readOps(key)...).Commit()
	if err != nil {
		return view{}, fmt.Errorf("budget: read %s: %w", key, err)
	}
	return parseView(key, resp.Responses)
}

// parseView reads the three ranges of readOps.
func parseView(key string, rs []*etcdserverpb.ResponseOp) (view, error) {
	var v view
	cfg := rs[0].GetResponseRange().Kvs
	if len(cfg) == 0 {
		return view{}, fmt.Errorf("%w: %s (set it with `drover budgets set %s --tokens N`)", ErrNoBudget, key, key)
	}
	if err := json.Unmarshal(cfg[0].Value, &v.cfg); err != nil {
		return view{}, fmt.Errorf("budget: %s has an unreadable configuration: %w", key, err)
	}
	v.cfgMR = cfg[0].ModRevision
	if st := rs[1].GetResponseRange().Kvs; len(st) > 0 {
		if err := json.Unmarshal(st[0].Value, &v.st); err != nil {
			return view{}, fmt.Errorf("budget: %s has unreadable counters: %w", key, err)
		}
		v.stMR = st[0].ModRevision
	}
	v.res = parseReservations(rs[2].GetResponseRange().Kvs)
	return v, nil
}

func parseReservations(kvs []*mvccpb.KeyValue) []Reservation {
	out := make([]Reservation, 0, len(kvs))
	for _, kv := range kvs {
		var r Reservation
		if json.Unmarshal(kv.Value, &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// commit writes st (and ops, under the extra conditions cmps) if budget
// key's configuration and counters are still as v read them: one
// transaction. It returns the revision written, or, when they are not as v
// read them, they as they are now, read by the same transaction (and
// cached).
func (c *Client) commit(ctx context.Context, key string, v view, st state, then []clientv3.Op, cmps ...clientv3.Cmp) (int64, *view, error) {
	sv, _ := json.Marshal(st)
	ops := append([]clientv3.Op{clientv3.OpPut(c.keys.BudgetState(key), string(sv))}, then...)
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.keys.BudgetConfig(key)), "=", v.cfgMR),
		clientv3.Compare(clientv3.ModRevision(c.keys.BudgetState(key)), "=", v.stMR))
	began := time.Now()
	resp, err := c.cli.Txn(ctx).If(cmps...).Then(ops...).Else(c.readOps(key)...).Commit()
	metrics.ObserveTxn("budget", began)
	if err != nil {
		c.forget(key)
		return 0, nil, fmt.Errorf("budget: write %s: %w", key, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil, nil
	}
	fresh, err := parseView(key, resp.Responses)
	if err != nil {
		c.forget(key)
		return 0, nil, err
	}
	c.remember(key, fresh)
	return 0, &fresh, nil
}
