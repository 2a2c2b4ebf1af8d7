package fleet_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestReportUsageFromHandlerContext: a handler a fleet worker runs
// reports its usage and the provider's headers through its context alone
// (the handler by type as the one for every type): the settle counts the
// tokens and lowers the remaining tokens to the provider's. Outside a
// handler, ReportUsage records nothing and says so.
func TestReportUsageFromHandlerContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	b := budget.New(cli, ns)
	defer b.Close()
	const key = "openai/gpt-4.1/key-prod"
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	if fleet.ReportUsage(ctx, 10, nil) {
		t.Fatal("ReportUsage outside a handler said it recorded")
	}
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	meta := queue.Metadata{Tenant: "acme", Budget: key, EstimatedTokens: 50}
	// callModel stands for code deep in a handler that has only a context.
	callModel := func(ctx context.Context, tokens int64, h http.Header) error {
		if !fleet.ReportUsage(ctx, tokens, h) {
			t.Error("ReportUsage in a handler said it did not record")
		}
		return nil
	}
	cfg := fleet.Config{
		Worker: queue.WorkerConfig{Namespace: ns, Queue: "llm", Drain: true},
		Handlers: map[string]queue.Handler{"chat": func(ctx context.Context, t *queue.Task) ([]byte, error) {
			return nil, callModel(ctx, 30, nil)
		}},
		Handler: func(ctx context.Context, t *queue.Task) ([]byte, error) {
			return nil, callModel(ctx, 70, http.Header{"X-Ratelimit-Remaining-Tokens": {"400"}, "X-Ratelimit-Reset-Tokens": {"1h"}})
		},
	}
	// The task by type first, then the other: one drained worker each.
	for _, task := range []queue.Task{{ID: "a", Type: "chat", Metadata: meta}, {ID: "b", Type: "other", Metadata: meta}} {
		if _, err := qc.Submit(ctx, "llm", []queue.Task{task}, nil); err != nil {
			t.Fatal(err)
		}
		w, err := fleet.NewWorker(ctx, cli, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	u, err := b.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// 30 + 70 used: drover counts 900 left, the provider 400.
	if u.RequestsUsed != 2 || u.Reserved != 0 || u.Remaining != 400 {
		t.Fatalf("requests %d, reserved %d, remaining %d; want 2, 0 and the provider's 400", u.RequestsUsed, u.Reserved, u.Remaining)
	}
	var settled int64
	for _, tu := range u.TenantUsage {
		settled += tu.Used
	}
	if settled != 100 {
		t.Fatalf("tenants' settled tokens %d, want 30 + 70", settled)
	}
}
