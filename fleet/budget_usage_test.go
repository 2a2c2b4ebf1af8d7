package fleet_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestBudgetSettlesTheResultsUsage runs tasks through a real worker whose
// handler returns a model's response: the gate settles the usage field
// of the result (OpenAI's total_tokens, prompt and completion tokens,
// Anthropic's input and output tokens) instead of the estimate; a
// handler's own report wins over its result's; a result without a usage,
// or with a usage that is not a number of tokens, settles the estimate.
// Once near the limit (one reservation a task) and once with ample room
// (tasks may then be admitted from blocks reserved ahead).
func TestBudgetSettlesTheResultsUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	b := budget.New(cli, ns)
	defer b.Close()
	results := map[string]string{
		"openai":    `{"id":"c1","usage":{"prompt_tokens":20,"completion_tokens":10,"total_tokens":30}}`,
		"pair":      `{"usage":{"prompt_tokens":10,"completion_tokens":15}}`,
		"anthropic": `{"content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":20,"output_tokens":5}}`,
		"reported":  `{"usage":{"total_tokens":500}}`, // the handler reports 7
		"negative":  `{"usage":{"total_tokens":-3}}`,
		"none":      `"just text"`,
	}
	const want = 30 + 25 + 25 + 7 + 50 + 50
	for _, tokens := range []int64{1000, 1_000_000} {
		key := fmt.Sprintf("openai/gpt-4.1/key-%d", tokens)
		if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: tokens, WindowSeconds: 86400}); err != nil {
			t.Fatal(err)
		}
		qc, err := queue.NewClient(cli, ns)
		if err != nil {
			t.Fatal(err)
		}
		q := fmt.Sprintf("llm-%d", tokens)
		var tasks []queue.Task
		for shape := range results {
			tasks = append(tasks, queue.Task{ID: fmt.Sprintf("%s-%d", shape, tokens), Type: shape, Metadata: queue.Metadata{Tenant: "acme", Budget: key, EstimatedTokens: 50}})
		}
		if res, err := qc.Submit(ctx, q, tasks, nil); err != nil || res.Submitted != len(tasks) {
			t.Fatal(res, err)
		}
		w, err := fleet.NewWorker(ctx, cli, fleet.Config{Worker: queue.WorkerConfig{Namespace: ns, Queue: q, Drain: true},
			Handler: func(ctx context.Context, t *queue.Task) ([]byte, error) {
				if t.Type == "reported" {
					fleet.ReportUsage(ctx, 7, nil)
				}
				return []byte(results[t.Type]), nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
		u, err := b.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if u.Used != want || u.Reserved != 0 || u.RequestsUsed != int64(len(results)) {
			t.Fatalf("budget of %d: used %d, reserved %d, requests %d; want %d, 0, %d", tokens, u.Used, u.Reserved, u.RequestsUsed, want, len(results))
		}
	}
}
