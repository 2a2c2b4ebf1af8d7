package budget_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

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
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 4000, Requests: 80, WindowSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	r, err := c.Reserve(ctx, key, "acme", 500, budget.WithBlock(10))
	if err != nil {
		t.Fatal(err)
	}
	if tok, req := r.Room(); r.Requests != 10 || tok != 3500 || req != 70 || r.WindowEnd().IsZero() {
		t.Fatalf("block: requests %d, room %d tokens and %d requests, window end %v; want 10, 3500, 70, set", r.Requests, tok, req, r.WindowEnd())
	}
	if u, _ := c.Get(ctx, key); u.RequestsUsed != 10 || u.Reserved != 500 {
		t.Fatalf("while the block is held: requests %d, reserved %d; want 10, 500", u.RequestsUsed, u.Reserved)
	}
	// Eleven requests of the eighty: no room left for BlockRoom more
	// blocks of ten.
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

// TestBlockNeedsRoomForMany: the budget admits a block only while it has
// room for BlockRoom blocks of its size, itself included, in requests and
// in tokens: workers that each saw ample room cannot together take the
// budget's last room as blocks. A lone reservation still fits after.
func TestBlockNeedsRoomForMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c := budget.New(srv.Client(t), ns)
	defer c.Close()
	const rk, tk = "openai/gpt-4.1/key-block-requests", "openai/gpt-4.1/key-block-tokens"
	if _, err := c.Set(ctx, budget.Budget{Key: rk, Requests: 100, WindowSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	// Blocks of 10 of 100 requests: 0, 10 and 20 used leave room for 8
	// more; 30 used does not.
	for i := range 3 {
		if _, err := c.Reserve(ctx, rk, "acme", 0, budget.WithBlock(10)); err != nil {
			t.Fatalf("block %d of 10 requests of 100: %v", i+1, err)
		}
	}
	if _, err := c.Reserve(ctx, rk, "acme", 0, budget.WithBlock(10)); !errors.Is(err, drover.ErrDeferred) {
		t.Fatalf("a block with 30 of 100 requests used: %v, want a refusal", err)
	}
	if _, err := c.Reserve(ctx, rk, "acme", 0); err != nil {
		t.Fatalf("a lone reservation after the refused block: %v", err)
	}
	if _, err := c.Set(ctx, budget.Budget{Key: tk, Tokens: 10_000, WindowSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, tk, "globex", 6000); err != nil {
		t.Fatal(err)
	}
	// 640 fits beside 6,000 of 10,000, eight of them do not.
	if _, err := c.Reserve(ctx, tk, "acme", 640, budget.WithBlock(32)); !errors.Is(err, drover.ErrDeferred) {
		t.Fatalf("a block of 640 tokens with 4,000 left: %v, want a refusal", err)
	}
	if _, err := c.Reserve(ctx, tk, "acme", 500, budget.WithBlock(32)); err != nil {
		t.Fatalf("a block of 500 tokens with 4,000 left: %v", err)
	}
}

// TestBlockGivesBackOnlyInItsWindow: a block's unused requests go back to
// its own window only. Settled after its window turned, it gives nothing
// back: the new window's requests (here another block's) stay as counted.
func TestBlockGivesBackOnlyInItsWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newFakeClock() // at the start of a minute
	c := budget.New(srv.Client(t), etcdtest.Namespace(t), budget.WithClock(clk.Now))
	defer c.Close()
	const wk = "openai/gpt-4.1/key-block-window"
	if _, err := c.Set(ctx, budget.Budget{Key: wk, Requests: 1000, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	old, err := c.Reserve(ctx, wk, "acme", 0, budget.WithBlock(10))
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Minute)
	if _, err := c.Reserve(ctx, wk, "acme", 0, budget.WithBlock(10)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SettleBlock(ctx, old, 0, 4, nil); err != nil {
		t.Fatal(err)
	}
	if u, _ := c.Get(ctx, wk); u.RequestsUsed != 10 {
		t.Fatalf("after settling last window's block of 10 with 4 calls: %d requests in this window, want 10 (nothing given back)", u.RequestsUsed)
	}
}
