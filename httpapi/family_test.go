package httpapi_test

import (
	"slices"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/childview/childviewtest"
	"github.com/droverhq/drover/queue"
)

// waitingParent runs a parent "boss" that spawned n children into queue
// kids (which no worker runs) and waits for them, and returns a queue
// client.
func waitingParent(t *testing.T, a *api, n int) *queue.Client {
	t.Helper()
	c := childviewtest.Start(t, a.cli, a.ns, childviewtest.Kids(n, nil))
	childviewtest.Parent(t, c, "boss", 30*time.Second)
	return c
}

// TestTaskShowsChildrenAndParent: GET of a parent that waits for its
// children gives their counts by state and the first page with each
// child's state (one acked SUCCEEDED, one cancelled CANCELLED, the rest
// PENDING); a child shows its parent's queue.
func TestTaskShowsChildrenAndParent(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	waitingParent(t, a, 5)
	sess := a.session(60)
	var claimed resp
	waitFor(t, "a child claimed", func() bool {
		claimed = a.do("POST", "/v1/queues/kids/claim", map[string]any{"session": sess, "max": 1}).want(t, 200)
		ts, _ := claimed.JSON["tasks"].([]any)
		return len(ts) == 1
	})
	k := claimed.JSON["tasks"].([]any)[0].(map[string]any)
	acked := k["task_id"].(string)
	a.do("POST", "/v1/queues/kids/tasks/"+acked+"/ack", map[string]any{"session": sess, "token": k["token"], "result": map[string]any{"hits": 3}}).want(t, 200)
	cancelled := "boss.1.4"
	if acked == cancelled {
		cancelled = "boss.1.3"
	}
	a.do("POST", "/v1/queues/kids/tasks/"+cancelled+"/cancel", nil).want(t, 200)

	var r resp
	waitFor(t, "the counts", func() bool {
		r = a.do("GET", "/v1/queues/wf/tasks/boss", nil).want(t, 200)
		ch, _ := r.JSON["children"].(map[string]any)
		return ch != nil && ch["succeeded"] == float64(1) && ch["failed"] == float64(1)
	})
	ch := r.JSON["children"].(map[string]any)
	if ch["spawned"] != float64(5) || ch["live"] != float64(3) || len(ch["steps"].([]any)) != 1 || ch["next_cursor"] != nil {
		t.Fatalf("children: %s", r.Raw)
	}
	states := map[string]string{}
	for _, x := range ch["children"].([]any) {
		m := x.(map[string]any)
		states[m["task_id"].(string)] = m["status"].(string)
		if m["queue"] != "kids" || m["step"] != float64(1) {
			t.Fatalf("child %v", m)
		}
	}
	if len(states) != 5 || states[acked] != "SUCCEEDED" || states[cancelled] != "CANCELLED" {
		t.Fatalf("states %v", states)
	}
	for id, st := range states {
		if id != acked && id != cancelled && st != "PENDING" {
			t.Fatalf("%s is %s, want PENDING", id, st)
		}
	}
	kid := a.do("GET", "/v1/queues/kids/tasks/boss.1.2", nil).want(t, 200)
	if kid.str("parent") != "boss" || kid.str("parent_queue") != "wf" || kid.JSON["children"] != nil {
		t.Fatalf("child: %s", kid.Raw)
	}
}

// TestTaskChildrenPages: GET .../children pages through a parent's
// children with a cursor, listing each exactly once in plan order; a
// childless task has none; a cursor that is not one is a 400 naming it;
// the route of another queue's task is a 404.
func TestTaskChildrenPages(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	waitingParent(t, a, 5)
	var got []string
	next := ""
	for pages := 0; pages == 0 || next != ""; pages++ {
		if pages > 5 {
			t.Fatal("the cursor does not end")
		}
		p := a.do("GET", "/v1/queues/wf/tasks/boss/children?limit=2&cursor="+next, nil).want(t, 200)
		for _, x := range p.JSON["children"].([]any) {
			got = append(got, x.(map[string]any)["task_id"].(string))
		}
		next = p.str("next_cursor")
	}
	want := []string{"boss.1.0", "boss.1.1", "boss.1.2", "boss.1.3", "boss.1.4"}
	if !slices.Equal(got, want) {
		t.Fatalf("the pages list %v, want %v", got, want)
	}
	none := a.do("GET", "/v1/queues/kids/tasks/boss.1.2/children", nil).want(t, 200)
	if none.num("spawned") != 0 || len(none.JSON["children"].([]any)) != 0 {
		t.Fatalf("children of a childless task: %s", none.Raw)
	}
	bad := a.do("GET", "/v1/queues/wf/tasks/boss/children?cursor=nope", nil).problem(t, 400)
	if errs, _ := bad.JSON["errors"].([]any); len(errs) == 0 || errs[0].(map[string]any)["location"] != "query.cursor" {
		t.Fatalf("bad cursor: %s", bad.Raw)
	}
	a.do("GET", "/v1/queues/kids/tasks/boss/children", nil).problem(t, 404)
}
