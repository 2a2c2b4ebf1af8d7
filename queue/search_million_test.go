package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestSearchMillion measures the search on a queue of a million tasks: the
// time to the first page for each kind of filter, and the rate of a scan.
// It takes minutes; run it with DROVER_SEARCH_MILLION=1 (see
// docs/BENCHMARKS.md). DROVER_SEARCH_TASKS changes the number of tasks.
func TestSearchMillion(t *testing.T) {
	if os.Getenv("DROVER_SEARCH_MILLION") == "" {
		t.Skip("set DROVER_SEARCH_MILLION=1 to search a queue of a million tasks")
	}
	n := 1_000_000
	if v := os.Getenv("DROVER_SEARCH_TASKS"); v != "" {
		fmt.Sscan(v, &n)
	}
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	// 20,000 SUCCEEDED and 100 DEAD first, then n PENDING of ten types.
	var done []queue.Task
	for i := range 20_100 {
		typ := map[bool]string{true: "ok", false: "bad"}[i < 20_000]
		done = append(done, queue.Task{ID: fmt.Sprintf("d-%06d", i), Type: typ})
	}
	if _, err := c.Submit(ctx, "big", done, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "big", Concurrency: 64, Prefetch: 64, Drain: true})
	w.Handle("ok", func(ctx context.Context, task *queue.Task) ([]byte, error) { return nil, nil })
	w.Handle("bad", func(ctx context.Context, task *queue.Task) ([]byte, error) {
		return nil, queue.Permanent(errors.New("no"))
	})
	runDrain(t, w)
	start := time.Now()
	var since time.Time
	for from := 0; from < n; from += 100_000 {
		if from+100_000 >= n {
			since = time.Now()
		}
		chunk := make([]queue.Task, 0, 100_000)
		for i := from; i < min(n, from+100_000); i++ {
			typ := fmt.Sprintf("type-%d", i%10)
			if i == n-1 {
				typ = "rare"
			}
			chunk = append(chunk, queue.Task{ID: fmt.Sprintf("t-%07d", i), Type: typ, Parameters: json.RawMessage(fmt.Sprintf(`{"n":%d,"shard":%d}`, i, i%1000))})
		}
		if _, err := c.Submit(ctx, "big", chunk, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("submitted %d tasks in %v", n, time.Since(start).Round(time.Millisecond))
	first := func(name string, sq queue.SearchQuery) {
		t0 := time.Now()
		p, err := c.Search(ctx, "big", sq)
		if err != nil {
			t.Fatal(err)
		}
		el := time.Since(t0)
		t.Logf("first page, %-28s %8v  %3d tasks, %7d read, more: %v", name, el.Round(time.Microsecond), len(p.Tasks), p.Scanned, p.Next != "")
		read := p.Scanned
		for pages := 1; len(p.Tasks) == 0 && p.Next != ""; pages++ {
			sq.Cursor = p.Next
			if p, err = c.Search(ctx, "big", sq); err != nil {
				t.Fatal(err)
			}
			read += p.Scanned
			if len(p.Tasks) > 0 {
				t.Logf("  first task found after %v, %d pages, %d read", time.Since(t0).Round(time.Microsecond), pages+1, read)
			}
		}
	}
	first("id prefix t-012345", queue.SearchQuery{IDPrefix: "t-012345"})
	first("status PENDING", queue.SearchQuery{Status: queue.Pending})
	first("status SUCCEEDED", queue.SearchQuery{Status: queue.Succeeded})
	first("status DEAD", queue.SearchQuery{Status: queue.Dead})
	first("type type-7", queue.SearchQuery{Type: "type-7"})
	first("type rare (scan, one page)", queue.SearchQuery{Type: "rare"})
	first("param shard=7", queue.SearchQuery{Params: []queue.ParamFilter{{Key: "shard", Value: "7"}}})
	first("since the last 100,000", queue.SearchQuery{Since: since.UTC().Format(time.RFC3339Nano), Type: "rare"})
	for _, tc := range []struct {
		name string
		sq   queue.SearchQuery
	}{
		{"type rare", queue.SearchQuery{Type: "rare"}},
		{"param n", queue.SearchQuery{Params: []queue.ParamFilter{{Key: "n", Value: fmt.Sprint(n - 1)}}}},
	} {
		t0, read, pages, found := time.Now(), 0, 0, 0
		var slowest time.Duration
		for sq := tc.sq; ; pages++ {
			p0 := time.Now()
			p, err := c.Search(ctx, "big", sq)
			if err != nil {
				t.Fatal(err)
			}
			slowest = max(slowest, time.Since(p0))
			read, found = read+p.Scanned, found+len(p.Tasks)
			if sq.Cursor = p.Next; p.Next == "" {
				break
			}
		}
		el := time.Since(t0)
		t.Logf("full scan, %-10s %d found, %d read in %v (%d pages, slowest %v): %.0f tasks/s", tc.name, found, read, el.Round(time.Millisecond),
			pages+1, slowest.Round(time.Millisecond), float64(read)/el.Seconds())
		if found != 1 {
			t.Errorf("%s: found %d, want 1", tc.name, found)
		}
	}
}
