package budget_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
)

// TestBlockReserveAndSettle: a block holds its requests and tokens like
// any reservation; its settle counts the tokens its calls used and gives
// back the requests they did not use. A block the budget has no room for
// is refused without a trace: the tenant gets no pending estimate.
func TestBlockReserveAndSettle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	c := budget.New(cli, ns)
	defer c.Close()
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 1000, Requests: 20, WindowSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	r, err := c.Reserve(ctx, key, "acme", 500, budget.WithBlock(10))
	if err != nil {
		t.Fatal(err)
	}
	if tok, req := r.Room(); r.Requests != 10 || tok != 500 || req != 10 || r.WindowEnd().IsZero() {
		t.Fatalf("block: requests %d, room %d tokens and %d requests, window end %v; want 10, 500, 10, set", r.Requests, tok, req, r.WindowEnd())
	}
	if u, _ := c.Get(ctx, key); u.RequestsUsed != 10 || u.Reserved != 500 {
		t.Fatalf("while the block is held: requests %d, reserved %d; want 10, 500", u.RequestsUsed, u.Reserved)
	}
	// Eleven requests of the twenty: one more block of ten does not fit.
	if _, err := c.Reserve(ctx, key, "acme", 10); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, key, "globex", 100, budget.WithBlock(10)); !errors.Is(err, drover.ErrDeferred) {
		t.Fatalf("a block beyond the requests left: %v, want a refusal", err)
	}
	if _, err := c.Reserve(ctx, key, "globex", 495, budget.WithBlock(2)); !errors.Is(err, drover.ErrDeferred) {
		t.Fatalf("a block beyond the tokens left: %v, want a refusal", err)
	}
	resp, err := cli.Get(ctx, keyspace.MustNew(ns).BudgetState(key))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatal(err)
	}
	var st struct {
		Tenants map[string]json.RawMessage `json:"tenants"`
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &st); err != nil || st.Tenants["globex"] != nil {
		t.Fatalf("refused blocks left a trace of globex: %s", resp.Kvs[0].Value)
	}
	s, err := c.SettleBlock(ctx, r, 320, 4, nil)
	if err != nil || s.Actual != 320 {
		t.Fatalf("settle of the block: %+v, %v", s, err)
	}
	if u, _ := c.Get(ctx, key); u.RequestsUsed != 5 || u.Used != 320 || u.Reserved != 10 {
		t.Fatalf("after the block's settle: requests %d, used %d, reserved %d; want 5 (4 calls and the lone one), 320, 10", u.RequestsUsed, u.Used, u.Reserved)
	}
	if _, err := c.SettleBlock(ctx, r, 320, 4, nil); !errors.Is(err, budget.ErrNotReserved) {
		t.Fatalf("a second settle of the block: %v, want ErrNotReserved", err)
	}
	if _, err := c.SettleBlock(ctx, r, 1, 11, nil); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("more calls than the block's requests: %v, want an input error", err)
	}
}
