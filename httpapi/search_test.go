package httpapi_test

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/droverhq/drover/internal/cursor"
)

// TestSearchRoute: GET /v1/queues/{queue}/search finds tasks by type, id
// prefix and parameter, pages with next_cursor, and answers bad input with
// a problem naming the query parameter.
func TestSearchRoute(t *testing.T) {
	t.Parallel()
	forged := cursor.Encode(cursor.Cursor{Digest: cursor.Digest("found", "", "", "", "", ""), Phase: "r", Index: 9})
	a := newAPI(t)
	body := qtasksJSON("s", 25)
	for i := range 5 {
		body = append(body, map[string]any{"task_id": fmt.Sprintf("y-%d", i), "task_type": "y", "parameters": map[string]any{"colour": "red"}})
	}
	a.do("POST", "/v1/queues/found/tasks", body).want(t, 200)
	count := func(query string) int {
		t.Helper()
		r := a.do("GET", "/v1/queues/found/search?"+query, nil).want(t, 200)
		data, _ := r.JSON["data"].([]any)
		return len(data)
	}
	for query, want := range map[string]int{
		"type=y": 5, "type=x&status=PENDING": 25, "type=x&status=pending": 25, "status=Pending&limit=1000": 30, "status=SUCCEEDED": 0, "id_prefix=s-1": 11,
		"param=colour%3Dred": 5, "param=i%3D7": 1, "param=i%3D7&param=colour%3Dred": 0, "since=1h&limit=1000": 30,
	} {
		if got := count(query); got != want {
			t.Errorf("%s: %d tasks, want %d", query, got, want)
		}
	}
	seen, cursor := map[string]bool{}, ""
	for pages := 0; pages < 20; pages++ {
		r := a.do("GET", "/v1/queues/found/search?type=x&limit=4&cursor="+url.QueryEscape(cursor), nil).want(t, 200)
		for _, d := range r.JSON["data"].([]any) {
			id := d.(map[string]any)["task_id"].(string)
			if seen[id] {
				t.Fatalf("%s on two pages", id)
			}
			seen[id] = true
		}
		if cursor = r.str("next_cursor"); cursor == "" {
			break
		}
	}
	if len(seen) != 25 {
		t.Fatalf("pages found %d tasks, want 25", len(seen))
	}
	first := a.do("GET", "/v1/queues/found/search?type=x&limit=2", nil).want(t, 200).str("next_cursor")
	for _, tc := range []struct{ name, query, location string }{
		{"status", "status=DONE", "query.status"},
		{"param key", "param=a%20b%3D1", "query.param"},
		{"param without value", "param=colour", "query.param"},
		{"since", "since=yesterday", "query.since"},
		{"range backwards", "since=2026-11-28T10:00:00Z&until=2026-11-28T09:00:00Z", "query.until"},
		{"cursor of another query", "type=y&cursor=" + first, "query.cursor"},
		{"cursor made up", "cursor=xyz", "query.cursor"},
		{"cursor out of range", "cursor=" + forged, "query.cursor"},
		{"limit", "limit=5000", "query.limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := a.do("GET", "/v1/queues/found/search?"+tc.query, nil).problem(t, 400)
			errs, _ := r.JSON["errors"].([]any)
			if len(errs) == 0 || errs[0].(map[string]any)["location"] != tc.location {
				t.Fatalf("problem does not name %s: %s", tc.location, r.Raw)
			}
		})
	}
	a.do("GET", "/v1/queues/nosuch/search", nil).problem(t, 404)
}
