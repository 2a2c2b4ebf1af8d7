package queue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// tenX is ten times etcd's default limit of operations in one request
// (--max-txn-ops 128): every path that grows with its input is taken with at
// least this many tasks at once.
const tenX = 1280

// walk lists every page of queue q's tasks in status st, pageSize at a
// time, and returns the ids in order; it fails on a repeated id.
func walk(t *testing.T, c *queue.Client, q string, st queue.Status, pageSize int) []string {
	t.Helper()
	var ids []string
	seen := map[string]bool{}
	after := ""
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("listing does not end")
		}
		p, err := c.List(context.Background(), q, st, queue.ListOptions{Limit: pageSize, After: after})
		if err != nil {
			t.Fatalf("list %s after %q: %v", st, after, err)
		}
		for _, task := range p.Tasks {
			if seen[task.ID] {
				t.Fatalf("%s listed twice", task.ID)
			}
			if task.CurrentStatus != st {
				t.Fatalf("%s listed as %s is %s", task.ID, st, task.CurrentStatus)
			}
			seen[task.ID] = true
			ids = append(ids, task.ID)
		}
		if p.Next == "" {
			return ids
		}
		after = p.Next
	}
}

// TestEveryPathAtTenTimesTheLimit takes every queue path whose requests
// grow with their input with 1,280 tasks at once: submission with 1,001
// priority levels (a marker per level in each request), the largest listing page, paging, a
// worker with the largest prefetch whose tasks all fail once (1,280 retry
// keys promoted) and then half die and half succeed with 20 KB results
// (acks past the request size), requeue of every dead task, bulk cancel,
// purge and retention. Before the listing read three keys per task in one
// request, a listing of more than 42 tasks failed with "too many
// operations in txn request".
func TestEveryPathAtTenTimesTheLimit(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	// Every request of 60 tasks carries 60 priority level markers.
	leveled := tasks(tenX, "work")
	for i := range leveled {
		leveled[i].ID = fmt.Sprintf("lv-%05d", i)
		leveled[i].Metadata.Priority = i % (queue.MaxPriority + 1)
	}
	if res, err := c.Submit(ctx, "levels", leveled, nil); err != nil || res.Submitted != tenX {
		t.Fatalf("submit with 1,001 levels: %+v, %v", res, err)
	}
	if ids := walk(t, c, "levels", queue.Pending, queue.MaxListLimit); len(ids) != tenX {
		t.Fatalf("%d pending tasks with 1,001 levels, want %d", len(ids), tenX)
	}
	all := tasks(tenX, "work")
	if res, err := c.Submit(ctx, "big", all, nil); err != nil || res.Submitted != tenX {
		t.Fatalf("submit: %+v, %v", res, err)
	}
	if ids := walk(t, c, "big", queue.Pending, queue.MaxListLimit); len(ids) != tenX {
		t.Fatalf("pages of 1000: %d pending tasks, want %d", len(ids), tenX)
	}
	if ids := walk(t, c, "big", queue.Pending, 7); len(ids) != tenX {
		t.Fatalf("pages of 7: %d pending tasks, want %d", len(ids), tenX)
	}
	if _, err := c.List(ctx, "big", queue.Pending, queue.ListOptions{Limit: queue.MaxListLimit + 1}); err == nil {
		t.Fatal("a page larger than the largest was accepted")
	}
	if _, err := c.List(ctx, "big", queue.Pending, queue.ListOptions{After: "../x\n"}); err == nil {
		t.Fatal("a cursor no listing gave was accepted")
	}

	var attempts atomic.Int64
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "big", Concurrency: 100, Prefetch: 100, Drain: true,
		BackoffBase: 1, BackoffMax: 2})
	result := bytes.Repeat([]byte("r"), 20<<10)
	w.HandleAll(func(ctx context.Context, task *queue.Task) ([]byte, error) {
		attempts.Add(1)
		switch {
		case task.Attempt == 1:
			return nil, errors.New("transient")
		case task.ID[len(task.ID)-1]%2 == 1:
			return nil, queue.Permanent(errors.New("odd"))
		}
		return result, nil
	})
	runDrain(t, w)
	st, err := c.Stats(ctx, "big")
	if err != nil || st.Succeeded != tenX/2 || st.Dead != tenX/2 || attempts.Load() != 2*tenX {
		t.Fatalf("stats %+v (%v), %d attempts; want %d succeeded, %d dead, %d attempts", st, err, tenX/2, tenX/2, 2*tenX, attempts.Load())
	}
	succeeded := walk(t, c, "big", queue.Succeeded, queue.MaxListLimit)
	dead := walk(t, c, "big", queue.Dead, 100)
	if len(succeeded) != tenX/2 || len(dead) != tenX/2 {
		t.Fatalf("listed %d succeeded, %d dead", len(succeeded), len(dead))
	}
	if got, err := c.Get(ctx, succeeded[0]); err != nil || !bytes.Equal(got.Result, result) {
		t.Fatalf("result of %s: %d bytes, %v", succeeded[0], len(got.Result), err)
	}

	var progressed atomic.Int64
	n, err := c.Requeue(ctx, "big", nil, func(done int) { progressed.Store(int64(done)) })
	if err != nil || n != tenX/2 || progressed.Load() != tenX/2 {
		t.Fatalf("requeue: %d, progress %d, %v", n, progressed.Load(), err)
	}
	if n, err := c.CancelTasks(ctx, "big", queue.Pending, nil, nil); err != nil || n != tenX/2 {
		t.Fatalf("cancel every pending task: %d, %v", n, err)
	}
	if st, _ := c.Stats(ctx, "big"); st.Cancelled != tenX/2 || st.Pending != 0 || st.Dead != 0 {
		t.Fatalf("after cancel: %+v", st)
	}
	if n, err := c.Purge(ctx, "big", queue.Cancelled, nil, nil); err != nil || n != tenX/2 {
		t.Fatalf("purge cancelled: %d, %v", n, err)
	}
	if n, err := c.RemoveExpired(ctx, "big", 0); err != nil || n != tenX/2 {
		t.Fatalf("retention: removed %d, %v", n, err)
	}
	if st, _ := c.Stats(ctx, "big"); st.Succeeded != tenX/2 || st.Total() != tenX/2 {
		t.Fatalf("after purge and retention: %+v (archived successes still count)", st)
	}
}

// TestSubmitConflicts: a task id is unique across queues. The same task
// submitted again into the same queue is a duplicate; the same id with
// another queue, type or content is rejected with its line number, in
// another request and within one.
func TestSubmitConflicts(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	ctx := context.Background()
	job := queue.Task{ID: "job-1", Type: "mail", Parameters: []byte(`{"a": 1, "b": [2, 3]}`)}
	if res, err := c.Submit(ctx, "qa", []queue.Task{job}, nil); err != nil || res.Submitted != 1 {
		t.Fatalf("submit: %+v, %v", res, err)
	}
	same := job
	same.Parameters = []byte(`{"b":[2,3],"a":1}`) // the same JSON value
	other := job
	other.Parameters = []byte(`{"a": 2, "b": [2, 3]}`)
	otherType := job
	otherType.Type = "sms"
	if res, err := c.Submit(ctx, "qa", []queue.Task{same}, nil); err != nil || res.Submitted != 0 || res.Duplicates != 1 || len(res.Rejected) != 0 {
		t.Fatalf("resubmit into qa: %+v, %v", res, err)
	}
	for _, diff := range []queue.Task{other, otherType} {
		res, err := c.Submit(ctx, "qa", []queue.Task{{ID: "fine", Type: "t"}, diff}, nil)
		if err != nil || res.Submitted != 1 || res.Duplicates != 0 || len(res.Rejected) != 1 || res.Rejected[0].Line != 2 ||
			!strings.Contains(res.Rejected[0].Error, "task_id job-1 already exists in queue qa with different content") {
			t.Fatalf("conflicting resubmit into qa: %+v, %v", res, err)
		}
		if _, err := c.Purge(ctx, "qa", queue.Pending, []string{"fine"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := c.Get(ctx, "job-1"); err != nil || got.Type != "mail" || string(got.Parameters) != `{"a":1,"b":[2,3]}` {
		t.Fatalf("job-1 changed: %+v, %v", got, err)
	}
	res, err := c.Submit(ctx, "qb", []queue.Task{job}, nil)
	if err != nil || res.Submitted != 0 || res.Duplicates != 0 || len(res.Rejected) != 1 ||
		!strings.Contains(res.Rejected[0].Error, "task_id job-1 already exists in queue qa") {
		t.Fatalf("submit into qb: %+v, %v", res, err)
	}
	if st, _ := c.Stats(ctx, "qb"); st.Total() != 0 {
		t.Fatalf("qb holds %+v", st)
	}
	// Within one submission.
	batch := []queue.Task{{ID: "x-1", Type: "t"}, {ID: "x-2", Type: "t"}, {ID: "x-1", Type: "t"}, {ID: "x-1", Type: "u"}}
	res, err = c.Submit(ctx, "qa", batch, nil)
	if err != nil || res.Submitted != 2 || res.Duplicates != 1 || len(res.Rejected) != 1 || res.Rejected[0].Line != 4 ||
		!strings.Contains(res.Rejected[0].Error, "also on line 1") {
		t.Fatalf("one batch: %+v, %v", res, err)
	}
	if got, err := c.Get(ctx, "x-1"); err != nil || got.Type != "t" {
		t.Fatalf("x-1: %+v, %v", got, err)
	}
	// 1,280 conflicts in one submission, across requests in flight.
	many := tasks(tenX, "a")
	if _, err := c.Submit(ctx, "qc", many, nil); err != nil {
		t.Fatal(err)
	}
	res, err = c.Submit(ctx, "qd", many, nil)
	if err != nil || len(res.Rejected) != tenX || res.Rejected[tenX-1].Line != tenX {
		t.Fatalf("1,280 conflicts: %d rejected, %v", len(res.Rejected), err)
	}
}

// TestSubmitRejectsTextThatIsNotUTF8: every free-text field of a task must
// be UTF-8; the others go in.
func TestSubmitRejectsTextThatIsNotUTF8(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	in := []queue.Task{
		{ID: "p", Type: "t", Parameters: []byte("{\"x\":\"\xff\"}")},
		{ID: "u", Type: "t", InputDataURI: "s3://\xc3"},
		{ID: "m", Type: "t", Metadata: queue.Metadata{Tenant: "\xe2\x82"}},
		{ID: "fine", Type: "t", Parameters: []byte(`{"x":"é"}`)},
	}
	res, err := c.Submit(context.Background(), "utf", in, nil)
	if err != nil || res.Submitted != 1 || len(res.Rejected) != 3 {
		t.Fatalf("%+v, %v", res, err)
	}
	for i, field := range []string{"parameters", "input_data_uri", "metadata.tenant"} {
		if rj := res.Rejected[i]; rj.Line != i+1 || !strings.Contains(rj.Error, "invalid "+field+": must be UTF-8 text") {
			t.Fatalf("rejected %+v, want line %d naming %s", rj, i+1, field)
		}
	}
}
