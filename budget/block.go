package budget

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/metrics"
)

// A block is one reservation that holds the requests and tokens of many
// calls at once, reserved ahead by a worker that admits its tasks from it
// without a round trip each (fleet's budget gate). It is a reservation
// like any other: counted in the budget for all it holds, bound to its
// holder's lease (a holder that dies releases it whole), settled once,
// with the tokens its calls used, giving back the requests it did not
// use. Its refusal writes nothing (no pending estimate): its holder then
// reserves call by call, as without blocks.

// MaxBlock is the most requests one block holds.
const MaxBlock = 1000

// BlockRoom is how many blocks of its size the budget must have room for
// (tokens, with the margin for the calls in flight, and requests) for a
// block to be admitted, itself included. The budget checks it in the
// reserve's transaction, so workers that each saw ample room a moment
// ago cannot together reserve the budget's last room as blocks: near the
// limits, every tenant reserves call by call and its share stays its own.
const BlockRoom = 8

// WithBlock makes the reservation a block of n requests (its estimate
// being the tokens of all of them). Refused, it records nothing of the
// tenant: the caller reserves call by call instead.
func WithBlock(n int64) ReserveOption { return func(o *reserveOpts) { o.block = n } }

// WindowEnd is when the window the reservation counts in ends, by the
// reserving client's clock (zero for a reservation read back).
func (r Reservation) WindowEnd() time.Time { return r.windowEnd }

// Room is what the budget had left once the reservation was admitted:
// tokens and requests (MaxTokens for a dimension not limited), as the
// reserving client decided it.
func (r Reservation) Room() (tokens, requests int64) { return r.roomTokens, r.roomRequests }

// SettleBlock settles block r (WithBlock): the calls admitted from it
// (at most its requests) used actual tokens in all. The requests it did
// not use are given back to its window, if that window is still the
// current one; h, the provider's headers of its latest call, as
// Settle's (unreadable ones are dropped). The learned error of the estimates does not count it: a
// block's error is not one call's. Errors as Settle's.
func (c *Client) SettleBlock(ctx context.Context, r Reservation, actual, calls int64, h http.Header) (Settlement, error) {
	if err := CheckKey(r.Budget); err != nil {
		return Settlement{}, err
	}
	if actual < 0 || actual > MaxTokens {
		return Settlement{}, &drover.InputError{Field: "actual", Value: actual, Rule: fmt.Sprintf("must be between 0 and %d tokens", MaxTokens)}
	}
	if calls < 0 || calls > max(1, r.Requests) {
		return Settlement{}, &drover.InputError{Field: "calls", Value: calls, Rule: "must be between 0 and the block's requests"}
	}
	remaining, reset, err := providerHeaders(h)
	if err != nil {
		remaining, reset = -1, 0 // the tokens count all the same
	}
	k := &call{settle: true, id: r.ID, actual: actual, remaining: remaining, reset: reset, calls: calls}
	if err := c.submit(ctx, r.Budget, k); err != nil {
		return Settlement{}, err
	}
	if k.err != nil {
		return Settlement{}, k.err
	}
	metrics.BudgetTokensSettled.WithLabelValues(r.Budget).Add(float64(actual))
	return k.out, nil
}

// quietBlock says whether a block of n requests and est tokens for tenant
// would be refused, without changing st.
func quietBlock(cfg Budget, st *state, res []Reservation, tenant string, est, n int64) *refusal {
	if cfg.Requests > 0 && st.Requests+BlockRoom*n > cfg.Requests {
		return &refusal{reason: fmt.Sprintf("%d requests of %d used in this window: no room for %d blocks of %d", st.Requests, cfg.Requests, BlockRoom, n)}
	}
	if cfg.Tokens > 0 {
		reserved, _ := held(res, st.Window)
		if total := st.Used + reserved + st.Floor + st.margin(res); total+BlockRoom*est > cfg.Tokens {
			return &refusal{reason: fmt.Sprintf("%d tokens of %d taken or kept back in this window: no room for %d blocks of %d", total, cfg.Tokens, BlockRoom, est)}
		}
	}
	return decide(cfg, st, res, tenant, est)
}

// giveBack returns to st the requests block rec held and its calls did
// not use.
func giveBack(st *state, rec Reservation, calls int64) {
	unused := max(0, max(1, rec.Requests)-calls)
	st.Requests = max(0, st.Requests-unused)
	if ts := st.Tenants[rec.Tenant]; ts != nil {
		ts.Requests = max(0, ts.Requests-unused)
	}
}

// room is what st and the live reservations res leave of cfg.
func room(cfg Budget, st *state, res []Reservation) (tokens, requests int64) {
	tokens, requests = MaxTokens, MaxTokens
	if cfg.Tokens > 0 {
		reserved, _ := held(res, st.Window)
		tokens = max(0, cfg.Tokens-st.Used-reserved-st.Floor)
	}
	if cfg.Requests > 0 {
		requests = max(0, cfg.Requests-st.Requests)
	}
	return tokens, requests
}
