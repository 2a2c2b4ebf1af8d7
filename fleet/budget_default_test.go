package fleet_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBudgetGateDefaultEstimate: a task that names a budget without
// estimated_tokens reserves the budget's default estimate for its type,
// and settles that default when its handler reports nothing.
func TestBudgetGateDefaultEstimate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli := srv.Client(t)
	b := budget.New(cli, etcdtest.Namespace(t))
	defer b.Close()
	const key = "openai/gpt-4.1/key-prod"
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 100_000, WindowSeconds: 86400, Estimates: map[string]int64{"summarize": 700}}); err != nil {
		t.Fatal(err)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), l.ID)
	gate := fleet.NewBudgetGate(b, func() clientv3.LeaseID { return l.ID }, nil)
	sum := &queue.Task{ID: "s", Type: "summarize", Metadata: queue.Metadata{Budget: key}}
	done, err := gate.Admit(ctx, sum)
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := b.Get(ctx, key); u.Reserved != 700 {
		t.Fatalf("reserved %d for a summarize without an estimate, want its type's 700", u.Reserved)
	}
	done(nil) // nothing reported: the default is settled
	explicit := &queue.Task{ID: "e", Type: "summarize", Metadata: queue.Metadata{Budget: key, EstimatedTokens: 50}}
	if done, err = gate.Admit(ctx, explicit); err != nil {
		t.Fatal(err)
	}
	done(nil)
	if err := gate.Flush(ctx); err != nil { // the settles are written after done returns
		t.Fatal(err)
	}
	if u, _ := b.Get(ctx, key); u.Used != 750 || u.Reserved != 0 {
		t.Fatalf("used %d, reserved %d; want 750 (the default and the explicit estimate), 0", u.Used, u.Reserved)
	}
}

// TestBudgetGateUsedWithHeaders: a Go handler's report with the
// provider's headers reaches the settle (the remaining tokens fall to the
// provider's); headers the settle cannot read are dropped, the tokens
// counted all the same.
func TestBudgetGateUsedWithHeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli := srv.Client(t)
	b := budget.New(cli, etcdtest.Namespace(t))
	defer b.Close()
	const key = "openai/gpt-4.1/key-prod"
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), l.ID)
	gate := fleet.NewBudgetGate(b, func() clientv3.LeaseID { return l.ID }, nil)
	bad := &queue.Task{ID: "bad", Type: "chat", Metadata: queue.Metadata{Budget: key, EstimatedTokens: 50}}
	done, err := gate.Admit(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	gate.UsedWithHeaders(bad, 30, http.Header{"X-Ratelimit-Remaining-Tokens": {"lots"}})
	done(nil)
	if err := gate.Flush(ctx); err != nil { // settled before the next, as written
		t.Fatal(err)
	}
	good := &queue.Task{ID: "good", Type: "chat", Metadata: queue.Metadata{Budget: key, EstimatedTokens: 50}}
	if done, err = gate.Admit(ctx, good); err != nil {
		t.Fatal(err)
	}
	gate.UsedWithHeaders(good, 70, http.Header{"X-Ratelimit-Remaining-Tokens": {"400"}, "X-Ratelimit-Reset-Tokens": {"1h"}, "Content-Type": {"application/json"}})
	done(nil)
	if err := gate.Flush(ctx); err != nil { // the settles are written after done returns
		t.Fatal(err)
	}
	// 30 + 70 used: drover counts 900 left, the provider 400.
	if u, _ := b.Get(ctx, key); u.Remaining != 400 || u.Reserved != 0 {
		t.Fatalf("remaining %d, reserved %d; want the provider's 400, 0", u.Remaining, u.Reserved)
	}
}
