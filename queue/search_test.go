package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// searchQueue fills queue "find" with 300 SUCCEEDED tasks a-NNN of type
// echo, 50 DEAD ones b-NNN of type fail and 120 PENDING ones c-NNN of type
// later, one of them (c-005) CANCELLED.
func searchQueue(t *testing.T) *queue.Client {
	t.Helper()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	var first []queue.Task
	for i := range 300 {
		tag := map[bool]string{true: "x", false: "y"}[i%2 == 0]
		first = append(first, queue.Task{ID: fmt.Sprintf("a-%03d", i), Type: "echo", Parameters: json.RawMessage(fmt.Sprintf(`{"n":%d,"tag":%q}`, i, tag))})
	}
	for i := range 50 {
		first = append(first, queue.Task{ID: fmt.Sprintf("b-%03d", i), Type: "fail", Parameters: json.RawMessage(fmt.Sprintf(`{"n":%d}`, 1000+i))})
	}
	if _, err := c.Submit(ctx, "find", first, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "find", Concurrency: 8, Drain: true})
	w.Handle("echo", func(ctx context.Context, task *queue.Task) ([]byte, error) { return nil, nil })
	w.Handle("fail", func(ctx context.Context, task *queue.Task) ([]byte, error) {
		return nil, queue.Permanent(errors.New("no"))
	})
	runDrain(t, w)
	var later []queue.Task
	for i := range 120 {
		later = append(later, queue.Task{ID: fmt.Sprintf("c-%03d", i), Type: "later", Parameters: json.RawMessage(`{"tag":"x"}`)})
	}
	if _, err := c.Submit(ctx, "find", later, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, "c-005"); err != nil {
		t.Fatal(err)
	}
	return c
}

// searchAll walks every page of sq and returns the ids found, in order.
func searchAll(t *testing.T, c *queue.Client, q string, sq queue.SearchQuery) []string {
	t.Helper()
	var ids []string
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("the search does not end")
		}
		p, err := c.Search(context.Background(), q, sq)
		if err != nil {
			t.Fatalf("search %+v: %v", sq, err)
		}
		if sq.Budget > 0 && p.Scanned > sq.Budget+200 {
			t.Fatalf("a page read %d tasks, budget %d", p.Scanned, sq.Budget)
		}
		for _, task := range p.Tasks {
			if sq.Status != "" && !strings.EqualFold(string(task.CurrentStatus), string(sq.Status)) {
				t.Fatalf("%s is %s, searched %s", task.ID, task.CurrentStatus, sq.Status)
			}
			ids = append(ids, task.ID)
		}
		if p.Next == "" {
			return ids
		}
		sq.Cursor = p.Next
	}
}

func TestSearchFilters(t *testing.T) {
	t.Parallel()
	c := searchQueue(t)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		name  string
		sq    queue.SearchQuery
		count int
		first string
	}{
		{"everything", queue.SearchQuery{}, 470, ""},
		{"succeeded", queue.SearchQuery{Status: queue.Succeeded}, 300, ""},
		{"dead", queue.SearchQuery{Status: queue.Dead}, 50, ""},
		{"pending", queue.SearchQuery{Status: "pending"}, 119, ""},
		{"cancelled", queue.SearchQuery{Status: queue.Cancelled}, 1, "c-005"},
		{"running", queue.SearchQuery{Status: queue.Running}, 0, ""},
		{"scheduled", queue.SearchQuery{Status: queue.Scheduled}, 0, ""},
		{"type", queue.SearchQuery{Type: "fail"}, 50, ""},
		{"type and status", queue.SearchQuery{Type: "fail", Status: queue.Succeeded}, 0, ""},
		{"id prefix", queue.SearchQuery{IDPrefix: "a-01"}, 10, "a-010"},
		{"id prefix and status", queue.SearchQuery{IDPrefix: "c-00", Status: queue.Pending}, 9, "c-000"},
		{"id prefix, none", queue.SearchQuery{IDPrefix: "zz"}, 0, ""},
		{"param string", queue.SearchQuery{Params: []queue.ParamFilter{{Key: "tag", Value: "x"}}}, 150 + 119 + 1, ""},
		{"param number", queue.SearchQuery{Params: []queue.ParamFilter{{Key: "n", Value: "7"}}}, 1, "a-007"},
		{"params, all of them", queue.SearchQuery{Params: []queue.ParamFilter{{Key: "tag", Value: "x"}, {Key: "n", Value: "8"}}}, 1, "a-008"},
		{"param missing", queue.SearchQuery{Params: []queue.ParamFilter{{Key: "colour", Value: "red"}}}, 0, ""},
		{"since the future", queue.SearchQuery{Since: future}, 0, ""},
		{"until the future", queue.SearchQuery{Until: future, Type: "later"}, 120, ""},
		{"since an hour ago", queue.SearchQuery{Since: "1h", Status: queue.Dead}, 50, ""},
		{"until an hour ago", queue.SearchQuery{Until: "1h"}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := searchAll(t, c, "find", tc.sq)
			if len(ids) != tc.count {
				t.Fatalf("found %d, want %d: %v", len(ids), tc.count, ids)
			}
			if tc.first != "" && ids[0] != tc.first {
				t.Fatalf("first %s, want %s", ids[0], tc.first)
			}
		})
	}
}

func TestSearchPagesSeeEachTaskOnce(t *testing.T) {
	t.Parallel()
	c := searchQueue(t)
	for _, sq := range []queue.SearchQuery{
		{Limit: 7},
		{Limit: 1, IDPrefix: "b-0"},
		{Limit: 13, Params: []queue.ParamFilter{{Key: "tag", Value: "x"}}},
		{Limit: 1000, Type: "later", Budget: 50},
		{Limit: 5, Budget: 1},
	} {
		ids := searchAll(t, c, "find", sq)
		seen := map[string]bool{}
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("%+v: %s found twice", sq, id)
			}
			seen[id] = true
		}
		all := searchAll(t, c, "find", queue.SearchQuery{Limit: 1000, Status: sq.Status, Type: sq.Type, IDPrefix: sq.IDPrefix, Params: sq.Params})
		sort.Strings(ids)
		sort.Strings(all)
		if fmt.Sprint(ids) != fmt.Sprint(all) {
			t.Fatalf("%+v: pages found %d tasks, one page %d", sq, len(ids), len(all))
		}
	}
}

func TestSearchStopsAtItsBudget(t *testing.T) {
	t.Parallel()
	c := searchQueue(t)
	// No task has type "none": each page reads one segment's worth and
	// says where to go on.
	p, err := c.Search(context.Background(), "find", queue.SearchQuery{Type: "none", Budget: 100})
	if err != nil || len(p.Tasks) != 0 || p.Next == "" || p.Scanned > 300 {
		t.Fatalf("first page: %d tasks, next %q, scanned %d, %v", len(p.Tasks), p.Next, p.Scanned, err)
	}
	if ids := searchAll(t, c, "find", queue.SearchQuery{Type: "none", Budget: 100}); len(ids) != 0 {
		t.Fatalf("found %v", ids)
	}
}

func TestSearchBadInput(t *testing.T) {
	t.Parallel()
	c := searchQueue(t)
	ctx := context.Background()
	p, err := c.Search(ctx, "find", queue.SearchQuery{Limit: 2, Type: "echo"})
	if err != nil || p.Next == "" {
		t.Fatalf("first page: %+v, %v", p, err)
	}
	if _, err := c.Search(ctx, "nosuch", queue.SearchQuery{}); !errors.Is(err, queue.ErrNoQueue) {
		t.Fatalf("unknown queue: %v", err)
	}
	for _, tc := range []struct {
		name, field string
		sq          queue.SearchQuery
	}{
		{"status", "status", queue.SearchQuery{Status: "DONE"}},
		{"param key", "param", queue.SearchQuery{Params: []queue.ParamFilter{{Key: "a b", Value: "1"}}}},
		{"param key empty", "param", queue.SearchQuery{Params: []queue.ParamFilter{{Key: "", Value: "1"}}}},
		{"since", "since", queue.SearchQuery{Since: "yesterday"}},
		{"until before since", "until", queue.SearchQuery{Since: "2026-11-28T10:00:00Z", Until: "2026-11-28T09:00:00Z"}},
		{"type", "type", queue.SearchQuery{Type: "a/b"}},
		{"id prefix", "id_prefix", queue.SearchQuery{IDPrefix: "a b"}},
		{"limit", "limit", queue.SearchQuery{Limit: 1001}},
		{"cursor of another query", "cursor", queue.SearchQuery{Type: "fail", Cursor: p.Next}},
		{"cursor of another queue", "cursor", queue.SearchQuery{Type: "echo", Cursor: p.Next}},
		{"cursor made up", "cursor", queue.SearchQuery{Cursor: "abc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := "find"
			if tc.name == "cursor of another queue" {
				q = "other"
			}
			_, err := c.Search(ctx, q, tc.sq)
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != tc.field {
				t.Fatalf("got %v, want an input error naming %s", err, tc.field)
			}
		})
	}
	if _, err := c.Search(ctx, "find", queue.SearchQuery{Limit: 2, Type: "echo", Cursor: p.Next}); err != nil {
		t.Fatalf("the same query's cursor: %v", err)
	}
}

func TestSearchStopsAtItsTimeBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, _ := newClient(t, etcdtest.Namespace(t))
	if _, err := c.Submit(ctx, "slow", tasks(4000, "x"), nil); err != nil { // 40 segments
		t.Fatal(err)
	}
	// Each look at the clock is 1.2 s later: the page's second look, after
	// its first batch of segments, is past its bound.
	at := time.Now()
	queue.SetClock(c, func() time.Time { at = at.Add(1200 * time.Millisecond); return at })
	p, err := c.Search(ctx, "slow", queue.SearchQuery{Type: "none"})
	if err != nil || len(p.Tasks) != 0 || p.Next == "" || p.Scanned >= 4000 {
		t.Fatalf("first page: %d tasks, next %q, scanned %d, %v", len(p.Tasks), p.Next, p.Scanned, err)
	}
	if ids := searchAll(t, c, "slow", queue.SearchQuery{Params: []queue.ParamFilter{{Key: "n", Value: "3999"}}}); len(ids) != 1 || ids[0] != "t-03999" {
		t.Fatalf("found %v", ids)
	}
}
