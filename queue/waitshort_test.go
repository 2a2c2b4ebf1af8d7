package queue_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The waits' tests pass with wait keys written in the JSON form that
// parks wrote before the short form (still read): a signal wakes the task,
// a timeout moves it back to pending, a cancel and a purge remove its key,
// and signals racing the park are never missed.
func TestWaitsWithJSONWaitValues(t *testing.T) {
	defer queue.SetShortWaitValues(false)()
	t.Run("stored as JSON", func(t *testing.T) { testWaitValueForm(t, true) })
	t.Run("wake", TestWaitSignalWakesParkedTask)
	t.Run("timeout", TestWaitTimesOut)
	t.Run("cancel and purge", TestWaitCancelAndPurge)
	t.Run("race", TestWaitSignalRacesThePark)
}

// A park stores its wait key's value in the short form, not the JSON.
func TestWaitValueStoredShort(t *testing.T) { testWaitValueForm(t, false) }

// testWaitValueForm parks a task and reads its wait key: its value is
// the JSON form (starts with '{') when asJSON, the short form otherwise.
func testWaitValueForm(t *testing.T, asJSON bool) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitOne(t, c, "agent-1")
	startSleepWorker(t, cli, ns, newStillClock(), newSignalLog().steps(3, 0, nil, 0))
	ctx := context.Background()
	var g *clientv3.GetResponse
	waitUntil(t, "the task to park", func() bool {
		var err error
		g, err = cli.Get(ctx, keyspace.MustNew(ns).QueueWait("q"), clientv3.WithPrefix())
		return err == nil && len(g.Kvs) == 1
	})
	if v := g.Kvs[0].Value; len(v) == 0 || (v[0] == '{') != asJSON {
		t.Fatalf("wait key value %q; want the JSON form %v", v, asJSON)
	}
}

// A parked task's record keeps when its wait began and when it times out
// once (its WAITING transition's time, its scheduled_at), not again in
// waiting_for; every read of the task gives them back, equal to the
// checkpoint's wait. A record that holds them in waiting_for (as parks
// wrote before) reads the same.
func TestWaitRecordKeepsTimesOnce(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitOne(t, c, "agent-7")
	store, _ := task.NewStore(cli, ns)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 2}) // on the real clock, as the claim's time is
	w.HandleAll(queue.Steps(store, newSignalLog().steps(2, time.Hour, nil, 0)...))
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	got := waitStatus(t, c, "agent-7", queue.Waiting)
	ctx := context.Background()
	keys := keyspace.MustNew(ns)
	raw, err := cli.Get(ctx, keys.TaskRecord("agent-7"))
	if err != nil || len(raw.Kvs) != 1 {
		t.Fatalf("record: %v", err)
	}
	var stored struct {
		WaitingFor map[string]json.RawMessage `json:"waiting_for"`
	}
	if err := json.Unmarshal(raw.Kvs[0].Value, &stored); err != nil {
		t.Fatal(err)
	}
	if _, ok := stored.WaitingFor["since"]; ok {
		t.Errorf("stored waiting_for %s repeats since", raw.Kvs[0].Value)
	}
	if _, ok := stored.WaitingFor["until"]; ok {
		t.Errorf("stored waiting_for %s repeats until", raw.Kvs[0].Value)
	}
	cp, err := store.Load(ctx, "agent-7")
	if err != nil || cp.Wait == nil {
		t.Fatalf("checkpoint %+v: %v", cp, err)
	}
	wf := got.WaitingFor
	if wf == nil || !wf.Since.Equal(cp.Wait.Since) || !wf.Until.Equal(cp.Wait.Until) || wf.Until.IsZero() {
		t.Fatalf("read waiting_for %+v; want since %s until %s (the checkpoint's)", wf, cp.Wait.Since, cp.Wait.Until)
	}
	page, err := c.List(ctx, "q", queue.Waiting, queue.ListOptions{})
	if err != nil || len(page.Tasks) != 1 || !page.Tasks[0].WaitingFor.Since.Equal(cp.Wait.Since) || !page.Tasks[0].WaitingFor.Until.Equal(cp.Wait.Until) {
		t.Fatalf("listed %+v (%v); want waiting_for with since and until", page.Tasks, err)
	}
	// The form parks wrote before (since and until in waiting_for, since
	// apart from the transition's time): read as stored.
	var full map[string]any
	_ = json.Unmarshal(raw.Kvs[0].Value, &full)
	since := cp.Wait.Since.Add(-time.Millisecond)
	full["waiting_for"] = map[string]any{"signals": []string{"approval"}, "since": since, "until": cp.Wait.Until}
	b, _ := json.Marshal(full)
	if _, err := cli.Put(ctx, keys.TaskRecord("agent-7"), string(b)); err != nil {
		t.Fatal(err)
	}
	back, err := c.Get(ctx, "agent-7")
	if err != nil || back.WaitingFor == nil || !back.WaitingFor.Since.Equal(since) || !back.WaitingFor.Until.Equal(cp.Wait.Until) {
		t.Fatalf("a full waiting_for read as %+v (%v); want it as stored", back, err)
	}
}
