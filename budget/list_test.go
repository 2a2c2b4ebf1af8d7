package budget_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestListMoreThanABatch lists 230 budgets, more than two of the list's
// transactions of count-only reads (100 budgets each): every budget is
// listed once, in key order, with its own number of live reservations,
// also those in the second and third batches. The clock stands still, so
// the window cannot turn between the first reserve and the list.
func TestListMoreThanABatch(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 11, 29, 12, 0, 30, 0, time.UTC)
	c := budget.New(srv.Client(t), etcdtest.Namespace(t), budget.WithClock(func() time.Time { return at }))
	t.Cleanup(func() { _ = c.Close() })
	const n = 230
	keyOf := func(i int) string { return fmt.Sprintf("openai/gpt-4.1/key-%03d", i) }
	live := func(i int) int { return i % 4 }
	for i := range n {
		if _, err := c.Set(ctx, budget.Budget{Key: keyOf(i), Tokens: 1000, WindowSeconds: 60}); err != nil {
			t.Fatal(err)
		}
		for range live(i) {
			if _, err := c.Reserve(ctx, keyOf(i), "acme", 10); err != nil {
				t.Fatal(err)
			}
		}
	}
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n {
		t.Fatalf("listed %d budgets, want %d", len(list), n)
	}
	for i, u := range list {
		if u.Key != keyOf(i) || u.Live != live(i) || u.RequestsUsed != int64(live(i)) {
			t.Fatalf("entry %d: %s with %d live, %d requests; want %s with %d", i, u.Key, u.Live, u.RequestsUsed, keyOf(i), live(i))
		}
	}
}
