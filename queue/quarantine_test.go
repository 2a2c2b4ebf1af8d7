package queue_test

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestUndecodableSegmentQuarantined: a FIFO queue's head segment whose
// value cannot be decoded (written here with the etcd client) does not
// stall the claims behind it: the worker moves it to the queue's
// quarantine keys, with its number of tasks and the error, counts it, and
// runs the next segment's task. Nothing is dropped: the segment's value
// and its task's index key are left as they were.
func TestUndecodableSegmentQuarantined(t *testing.T) {
	notDeflate := "\xff not a segment"
	for _, fifo := range []bool{true, false} {
		t.Run(map[bool]string{true: "fifo", false: "any order"}[fifo], func(t *testing.T) { undecodableSegment(t, fifo, notDeflate) })
	}
	// Values of the formats this drover knows that do not decode.
	t.Run("damaged binary", func(t *testing.T) { undecodableSegment(t, false, deflated(t, "\x02\xff\xff\xff\xff\xff\xff")) })
	t.Run("damaged json", func(t *testing.T) { undecodableSegment(t, true, deflated(t, `[{"id":`)) })
}

// deflated returns raw compressed with DEFLATE, as segments are stored.
func deflated(t *testing.T, raw string) string {
	t.Helper()
	var buf bytes.Buffer
	zw, err := flate.NewWriter(&buf, flate.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// undecodableSegment is TestUndecodableSegmentQuarantined in a FIFO
// queue or not. In a queue of any order a claim that reads several
// segments at once finds the undecodable one too.
func undecodableSegment(t *testing.T, fifo bool, garbage string) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "quarantine"
	if err := c.SetConfig(ctx, q, queue.Config{FIFO: fifo}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"head", "behind"} { // one segment each, head first
		if _, err := c.Submit(ctx, q, []queue.Task{{ID: id, Type: "t"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := keyspace.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := cli.Get(ctx, keys.TaskIndex("head"))
	if err != nil || len(idx.Kvs) != 1 {
		t.Fatalf("index of head: %v, %v", idx, err)
	}
	parts := strings.Split(string(idx.Kvs[0].Value), "/") // queue/segment/slot
	if len(parts) != 3 {
		t.Fatalf("index value %q", idx.Kvs[0].Value)
	}
	seg := parts[1]
	if _, err := cli.Put(ctx, keys.Segment(q, seg), garbage); err != nil {
		t.Fatal(err)
	}
	counted := metrics.SegmentsQuarantined.WithLabelValues(q)
	before := testutil.ToFloat64(counted)

	var mu sync.Mutex
	var ran []string
	quarantinedFirst := false
	// Two slots: a claim reads both segments, and quarantines the one it
	// cannot decode before it takes the other's task.
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 2})
	w.HandleAll(func(hctx context.Context, task *queue.Task) ([]byte, error) {
		r, err := cli.Get(hctx, keys.SegmentQuarantined(q, seg), clientv3.WithCountOnly())
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, task.ID)
		quarantinedFirst = err == nil && r.Count == 1
		return nil, nil
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second) // a bound for the test, not a figure it measures
	defer cancel()
	got, err := c.Wait(waitCtx, "behind")
	stop()
	if runErr := <-done; runErr != nil {
		t.Fatalf("Run: %v", runErr)
	}
	if err != nil || got.CurrentStatus != queue.Succeeded {
		t.Fatalf("the task behind an undecodable head: %v, %v; want SUCCEEDED", got, err)
	}
	mu.Lock()
	if len(ran) != 1 || ran[0] != "behind" {
		t.Errorf("handlers ran %v, want only behind", ran)
	}
	if !quarantinedFirst {
		t.Error("the task behind started before the undecodable segment was quarantined")
	}
	mu.Unlock()

	if n := testutil.ToFloat64(counted) - before; n != 1 {
		t.Errorf("drover_segments_quarantined_total grew by %v, want 1", n)
	}
	qk, err := cli.Get(ctx, keys.SegmentQuarantined(q, seg))
	if err != nil || len(qk.Kvs) != 1 {
		t.Fatalf("quarantine key: %v, %v", qk, err)
	}
	var v struct {
		Tasks string `json:"tasks"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(qk.Kvs[0].Value, &v); err != nil || v.Tasks != "1" || !strings.Contains(v.Error, "unreadable") {
		t.Errorf("quarantine value %s (%v): want 1 task and the decode error", qk.Kvs[0].Value, err)
	}
	for key, want := range map[string]string{keys.Segment(q, seg): garbage, keys.TaskIndex("head"): string(idx.Kvs[0].Value)} {
		r, err := cli.Get(ctx, key)
		if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != want {
			t.Errorf("%s after the quarantine: %v (err %v), want it kept as %q", key, r.Kvs, err, want)
		}
	}
	if r, err := cli.Get(ctx, keys.SegmentOpen(q, seg), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Errorf("the quarantined segment is still open (%v, err %v)", r.Count, err)
	}
}

// TestUnknownFormatSegmentSkipped: a segment that decompresses but whose
// first byte names a format this drover does not know (a newer drover
// wrote it, during a rolling upgrade) is not quarantined: the worker
// skips it, warns and counts it, and leaves it open for a worker that
// knows the format. A queue of any order runs the tasks behind it; a
// FIFO queue's worker waits for it, so that order holds, and runs it
// first once it can read it.
func TestUnknownFormatSegmentSkipped(t *testing.T) {
	t.Run("any order", func(t *testing.T) { unknownFormatSegment(t, false) })
	t.Run("fifo", func(t *testing.T) { unknownFormatSegment(t, true) })
}

func unknownFormatSegment(t *testing.T, fifo bool) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "foreign"
	if err := c.SetConfig(ctx, q, queue.Config{FIFO: fifo}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"head", "behind"} { // one segment each, head first
		if _, err := c.Submit(ctx, q, []queue.Task{{ID: id, Type: "t"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := keyspace.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := cli.Get(ctx, keys.TaskIndex("head"))
	if err != nil || len(idx.Kvs) != 1 {
		t.Fatalf("index of head: %v, %v", idx, err)
	}
	seg := strings.Split(string(idx.Kvs[0].Value), "/")[1] // queue/segment/slot
	orig, err := cli.Get(ctx, keys.Segment(q, seg))
	if err != nil || len(orig.Kvs) != 1 {
		t.Fatalf("segment of head: %v, %v", orig, err)
	}
	future := deflated(t, "\x7fa format of a later drover")
	if _, err := cli.Put(ctx, keys.Segment(q, seg), future); err != nil {
		t.Fatal(err)
	}
	counted := metrics.SegmentsUnknownFormat.WithLabelValues(q)
	before := testutil.ToFloat64(counted)
	quarantinedBefore := testutil.ToFloat64(metrics.SegmentsQuarantined.WithLabelValues(q))

	var mu sync.Mutex
	var ran []string
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1})
	w.HandleAll(func(_ context.Context, task *queue.Task) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, task.ID)
		return nil, nil
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second) // a bound for the test, not a figure it measures
	defer cancel()
	if !fifo {
		if got, err := c.Wait(waitCtx, "behind"); err != nil || got.CurrentStatus != queue.Succeeded {
			t.Fatalf("the task behind a segment of an unknown format: %v, %v; want SUCCEEDED", got, err)
		}
	}
	for i := 0; testutil.ToFloat64(counted) == before; i++ {
		if i == 3000 {
			t.Fatal("drover_segments_unknown_format_total never grew")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fifo {
		// The worker read the head and skipped it: behind must wait. A
		// worker that knows the format is played by putting the value
		// back; a task submitted after wakes the worker.
		if got, err := c.Get(ctx, "behind"); err != nil || got.CurrentStatus != queue.Pending {
			t.Fatalf("in a FIFO queue the task behind a segment of an unknown format is %v (err %v), want PENDING", got, err)
		}
		if _, err := cli.Put(ctx, keys.Segment(q, seg), string(orig.Kvs[0].Value)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Submit(ctx, q, []queue.Task{{ID: "wake", Type: "t"}}, nil); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Wait(waitCtx, "wake"); err != nil || got.CurrentStatus != queue.Succeeded {
			t.Fatalf("wake: %v, %v; want SUCCEEDED", got, err)
		}
		mu.Lock()
		if strings.Join(ran, ",") != "head,behind,wake" {
			t.Errorf("handlers ran %v, want head, behind, wake in that order", ran)
		}
		mu.Unlock()
		return
	}
	if n := testutil.ToFloat64(counted) - before; n != 1 {
		t.Errorf("drover_segments_unknown_format_total grew by %v, want 1", n)
	}
	if n := testutil.ToFloat64(metrics.SegmentsQuarantined.WithLabelValues(q)) - quarantinedBefore; n != 0 {
		t.Errorf("drover_segments_quarantined_total grew by %v, want 0", n)
	}
	if r, err := cli.Get(ctx, keys.SegmentQuarantined(q, seg), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Errorf("a segment of an unknown format was quarantined (%v, err %v)", r.Count, err)
	}
	if r, err := cli.Get(ctx, keys.SegmentOpen(q, seg), clientv3.WithCountOnly()); err != nil || r.Count != 1 {
		t.Errorf("a segment of an unknown format is no longer open (%v, err %v)", r.Count, err)
	}
	if r, err := cli.Get(ctx, keys.Segment(q, seg)); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != future {
		t.Errorf("a segment of an unknown format was changed (%v, err %v)", r.Kvs, err)
	}
	mu.Lock()
	if strings.Join(ran, ",") != "behind" {
		t.Errorf("handlers ran %v, want only behind", ran)
	}
	mu.Unlock()
}

// TestQuarantinedSegmentReads: once a segment is quarantined, Get of one
// of its tasks fails with ErrQuarantined naming the segment's key, a
// search skips it (walking the segments or the ids), and DeleteQueue
// refuses the queue, changing nothing, until the quarantined tasks' index
// keys and the quarantine key are deleted, as its error says; then their
// ids are free again.
func TestQuarantinedSegmentReads(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "quarantine-reads"
	for _, id := range []string{"head", "behind"} { // one segment each
		if _, err := c.Submit(ctx, q, []queue.Task{{ID: id, Type: "t"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := keyspace.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := cli.Get(ctx, keys.TaskIndex("head"))
	if err != nil || len(idx.Kvs) != 1 {
		t.Fatalf("index of head: %v, %v", idx, err)
	}
	seg := strings.Split(string(idx.Kvs[0].Value), "/")[1] // queue/segment/slot
	if _, err := cli.Put(ctx, keys.Segment(q, seg), "\xff not a segment"); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 2})
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second) // a bound for the test, not a figure it measures
	defer cancel()
	got, err := c.Wait(waitCtx, "behind")
	stop()
	if runErr := <-done; runErr != nil {
		t.Fatalf("Run: %v", runErr)
	}
	if err != nil || got.CurrentStatus != queue.Succeeded {
		t.Fatalf("behind: %v, %v; want SUCCEEDED", got, err)
	}
	if r, err := cli.Get(ctx, keys.SegmentQuarantined(q, seg), clientv3.WithCountOnly()); err != nil || r.Count != 1 {
		t.Fatalf("the segment was not quarantined (%v, err %v)", r, err)
	}

	if _, err := c.Get(ctx, "head"); !errors.Is(err, queue.ErrQuarantined) || !strings.Contains(err.Error(), keys.Segment(q, seg)) {
		t.Errorf("Get of a quarantined task: %v; want ErrQuarantined naming %s", err, keys.Segment(q, seg))
	}
	for _, sq := range []queue.SearchQuery{{}, {IDPrefix: "b"}, {IDPrefix: "head"}, {Type: "t"}} {
		var ids []string
		for page := 0; page == 0 || sq.Cursor != ""; page++ {
			p, err := c.Search(ctx, q, sq)
			if err != nil {
				t.Fatalf("search %+v over a quarantined segment: %v", sq, err)
			}
			for _, task := range p.Tasks {
				ids = append(ids, task.ID)
			}
			if sq.Cursor = p.Next; page == 100 {
				t.Fatalf("search %+v: over 100 pages", sq)
			}
		}
		want := "behind"
		if sq.IDPrefix == "head" {
			want = ""
		}
		if strings.Join(ids, ",") != want {
			t.Errorf("search %+v found %v, want %q (the quarantined task skipped)", sq, ids, want)
		}
	}

	_, err = c.DeleteQueue(ctx, q, nil)
	if !errors.Is(err, queue.ErrQuarantined) || !strings.Contains(err.Error(), keys.Segment(q, seg)) {
		t.Fatalf("DeleteQueue of a queue with a quarantined segment: %v; want ErrQuarantined naming %s", err, keys.Segment(q, seg))
	}
	if got, err := c.Get(ctx, "behind"); err != nil || got.CurrentStatus != queue.Succeeded {
		t.Fatalf("after the refused delete behind is %v (err %v), want it kept", got, err)
	}
	// As the error says: the quarantined tasks' index keys (found by
	// their value), then the quarantine key.
	all, err := cli.Get(ctx, keys.TaskIndex(""), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range all.Kvs {
		if strings.HasPrefix(string(kv.Value), q+"/"+seg+"/") {
			if _, err := cli.Delete(ctx, string(kv.Key)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := cli.Delete(ctx, keys.SegmentQuarantined(q, seg)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteQueue(ctx, q, nil); err != nil {
		t.Fatalf("DeleteQueue once the quarantine was cleared: %v", err)
	}
	res, err := c.Submit(ctx, q, []queue.Task{{ID: "head", Type: "t"}, {ID: "behind", Type: "t"}}, nil)
	if err != nil || res.Submitted != 2 || res.Duplicates != 0 {
		t.Fatalf("submitting the deleted queue's ids again: %+v, %v; want both new", res, err)
	}
}

// TestUnknownFormatSegmentSkippedBySearch: a search that reaches a
// segment of a format this drover does not know through the id index
// leaves its tasks out (a newer drover's servers search them) and finds
// the others, as it does walking the segments.
func TestUnknownFormatSegmentSkippedBySearch(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "foreignsearch"
	for _, id := range []string{"head", "behind"} { // one segment each
		if _, err := c.Submit(ctx, q, []queue.Task{{ID: id, Type: "t"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	keys := keyspace.MustNew(ns)
	idx, err := cli.Get(ctx, keys.TaskIndex("head"))
	if err != nil || len(idx.Kvs) != 1 {
		t.Fatalf("index of head: %v, %v", idx, err)
	}
	seg := strings.Split(string(idx.Kvs[0].Value), "/")[1] // queue/segment/slot
	if _, err := cli.Put(ctx, keys.Segment(q, seg), deflated(t, "\x7fa format of a later drover")); err != nil {
		t.Fatal(err)
	}
	for _, sq := range []queue.SearchQuery{{}, {IDPrefix: "b"}, {IDPrefix: "h"}, {IDPrefix: "head"}} {
		var ids []string
		for page := 0; page == 0 || sq.Cursor != ""; page++ {
			p, err := c.Search(ctx, q, sq)
			if err != nil {
				t.Fatalf("search %+v over a segment of an unknown format: %v", sq, err)
			}
			for _, task := range p.Tasks {
				ids = append(ids, task.ID)
			}
			if sq.Cursor = p.Next; page == 100 {
				t.Fatalf("search %+v: over 100 pages", sq)
			}
		}
		want := "behind"
		if strings.HasPrefix("head", sq.IDPrefix) && sq.IDPrefix != "" {
			want = ""
		}
		if strings.Join(ids, ",") != want {
			t.Errorf("search %+v found %v, want %q (the task of an unknown format skipped)", sq, ids, want)
		}
	}
}
