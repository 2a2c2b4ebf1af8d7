package agentserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A run admitted on the thread while its state update runs (after the
// read that found the thread free) makes the update a 409 and its state
// is not stored: the check is in the transaction that stores it.
func TestUpdateStateRefusedWhenARunCameMeanwhile(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{"metadata": map[string]any{"graph_id": "agent"}}).Obj["thread_id"].(string)
	release := make(chan struct{})
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		if p["op"] != "update_state" { // the run: active until the test ends
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
		if ans := a.do("POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}); ans.Status != 200 {
			t.Errorf("run created during the update: %d %s", ans.Status, ans.Raw)
		}
		raw, _ := json.Marshal(map[string]any{"checkpoint": map[string]any{"checkpoint_id": "c9"},
			"state": map[string]any{"values": p["values"], "next": []any{}, "tasks": []any{}, "checkpoint": map[string]any{"checkpoint_id": "c9"}}})
		return raw
	})
	t.Cleanup(func() { close(release) }) // before the runtime stops
	a.must(409, "POST", "/threads/"+th+"/state", map[string]any{"values": map[string]any{"x": 1}, "as_node": "agent"})
	if v, _ := a.must(200, "GET", "/threads/"+th, nil).Obj["values"].(map[string]any); v["x"] != nil {
		t.Fatalf("thread values %v: the refused update's state was stored", v)
	}
	if h := a.must(200, "POST", "/threads/"+th+"/history", map[string]any{}).List; len(h) != 0 {
		t.Fatalf("history %v: the refused update's state was stored", h)
	}
}

// A run that begins and ends on the thread while its state update runs
// (its index key gone again by the time the update's state is stored)
// makes the update a 409 too: the run's state, stored since, is kept.
func TestUpdateStateRefusedWhenARunEndedMeanwhile(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{"metadata": map[string]any{"graph_id": "agent"}}).Obj["thread_id"].(string)
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		if p["op"] != "update_state" { // the run: ends at once, storing its state
			r := p["run"].(map[string]any)
			if ans := a.do("PUT", "/v1/agent-server/threads/"+th+"/runs/"+r["run_id"].(string)+"/outcome",
				map[string]any{"token": token, "status": "success", "state": valuesState(map[string]any{"by": "run"})}); ans.Status != 200 {
				t.Errorf("outcome: %d %s", ans.Status, ans.Raw)
			}
			return nil
		}
		run := a.do("POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"})
		if run.Status != 200 {
			t.Errorf("run created during the update: %d %s", run.Status, run.Raw)
			return nil
		}
		if ans := a.do("GET", "/threads/"+th+"/runs/"+run.Obj["run_id"].(string)+"/join", nil); ans.Status != 200 {
			t.Errorf("join of the run created during the update: %d %s", ans.Status, ans.Raw)
		}
		raw, _ := json.Marshal(map[string]any{"checkpoint": map[string]any{"checkpoint_id": "c9"},
			"state": map[string]any{"values": p["values"], "next": []any{}, "tasks": []any{}, "checkpoint": map[string]any{"checkpoint_id": "c9"}}})
		return raw
	})
	a.must(409, "POST", "/threads/"+th+"/state", map[string]any{"values": map[string]any{"by": "update"}, "as_node": "agent"})
	if v, _ := a.must(200, "GET", "/threads/"+th, nil).Obj["values"].(map[string]any); v["by"] != "run" {
		t.Fatalf("thread values %v: want the run's, not the refused update's", v)
	}
}

// A create with interrupt or rollback that fails (the store past its
// high-water mark) stops nothing: the run it would have stopped runs on,
// its checkpoint kept, and succeeds.
func TestFailedCreateStopsNothing(t *testing.T) {
	for _, strategy := range []string{"interrupt", "rollback"} {
		t.Run(strategy, func(t *testing.T) {
			a := newAPI(t)
			th := newThread(t, a)
			f := newFakeRuntime(t, a, true)
			first := createRun(a, th, "reject")
			<-f.started
			ctx, keys := context.Background(), keyspace.MustNew(a.ns)
			if err := storeguard.Set(ctx, a.cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.8, LowWater: 0.7, Since: time.Now()}, keys); err != nil {
				t.Fatal(err)
			}
			a.must(507, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "multitask_strategy": strategy})
			if err := storeguard.Clear(ctx, a.cli, keys); err != nil {
				t.Fatal(err)
			}
			if st := taskStatus(t, f.q, first); st != queue.Running {
				t.Fatalf("the first run's task after a failed create: %s, want running", st)
			}
			if n := checkpointsOf(t, a, th); n[first] != 1 {
				t.Fatalf("checkpoints by run %v: want the first run's kept", n)
			}
			f.release(first)
			if st := joined(a, th, first); st != "success" {
				t.Fatalf("first run %s after a failed create, want success", st)
			}
			if f.lateRefused.Load() != 0 {
				t.Fatalf("%d writes of the first run refused: it was stopped", f.lateRefused.Load())
			}
		})
	}
}

// A server that dies after the transaction that admits a run with
// interrupt, before it stopped the run before: the next read of the new
// run stops that run (its late write refused) and then submits the new
// run's task, which runs.
func TestInterruptCrashAfterAdmissionStopsOnRead(t *testing.T) {
	a := newAPI(t)
	th := newThread(t, a)
	f := newFakeRuntime(t, a, true)
	first := createRun(a, th, "reject")
	<-f.started
	second := admitThenCrash(t, a, f, th, first, "interrupt")
	if r := storedRun(t, a, th, first); r["status"] != "interrupted" || r["ended"] != true {
		t.Fatalf("the stopped run %v: want ended interrupted with the admission", r)
	}
	joinedCh := make(chan string, 1)
	go func() { joinedCh <- joined(a, th, second) }()
	if got := <-f.started; got != second {
		t.Fatalf("started %s, want %s", got, second)
	}
	f.release(second)
	if st := <-joinedCh; st != "success" {
		t.Fatalf("new run %s, want success", st)
	}
	if f.lateRefused.Load() != 1 || f.lateAccepted.Load() != 0 {
		t.Fatalf("late writes of the stopped run: %d refused, %d accepted; want 1 and 0", f.lateRefused.Load(), f.lateAccepted.Load())
	}
}

// A create whose request ends (its time bound passed) just after the
// transaction that admits its run still stops the run it replaces and
// submits its own task: the request's end leaves neither half done.
func TestCreateFinishesItsStopsWhenItsRequestEnds(t *testing.T) {
	a := newAPI(t)
	th := newThread(t, a)
	f := newFakeRuntime(t, a, true)
	first := createRun(a, th, "reject")
	<-f.started
	admitted := make(chan struct{})
	c := newAPI(t, func(cfg *httpapi.Config) {
		cfg.Etcd, cfg.Namespace = hangupClient(t, a.cli, keyspace.MustNew(a.ns).AgentRuns(th), first, func() { close(admitted) }), a.ns
		cfg.RequestTimeout = 2 * time.Second // the admission returns once it has passed
	})
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		req, _ := http.NewRequest("POST", c.base+"/threads/"+th+"/runs", strings.NewReader(`{"assistant_id":"agent","multitask_strategy":"interrupt"}`))
		req.Header = c.hdr.Clone()
		req.Header.Set("Content-Type", "application/json")
		if resp, err := c.hc.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	select {
	case <-admitted:
	case <-time.After(30 * time.Second):
		t.Fatal("the new run was not admitted in 30 s")
	}
	select {
	case <-answered:
	case <-time.After(60 * time.Second):
		t.Fatal("the create did not answer in 60 s")
	}
	select {
	case got := <-f.started:
		if got == first {
			t.Fatalf("started %s again", got)
		}
		f.release(got)
	case <-time.After(30 * time.Second):
		t.Fatal("the new run's task did not start in 30 s after its request ended")
	}
	if st := taskStatus(t, f.q, first); st != queue.Cancelled {
		t.Fatalf("the stopped run's task: %s, want cancelled", st)
	}
}

// admitThenCrash creates a run with strategy on thread th through a
// server that dies after ever more writes, until one dies after the
// transaction that admits it (first, running, is stopped by it): it
// answers the new run's id.
func admitThenCrash(t *testing.T, a *api, f *fakeRuntime, th, first, strategy string) string {
	t.Helper()
	sp := keyspace.MustNew(a.ns)
	var second string
	for n := int64(0); n < 8 && second == ""; n++ { // the first crash point after which the new run is stored
		c := newAPI(t, func(cfg *httpapi.Config) { cfg.Etcd, cfg.Namespace = crashClient(t, a.cli, n), a.ns })
		if ans := c.do("POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "multitask_strategy": strategy}); ans.Status == 200 {
			t.Fatalf("create with %d writes answered 200: want the crash", n)
		}
		resp, err := a.cli.Get(context.Background(), sp.AgentRuns(th), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if id := string(kv.Key[len(sp.AgentRuns(th)):]); id != first {
				second = id
			}
		}
		if second == "" { // nothing admitted: nothing stopped
			if st := taskStatus(t, f.q, first); st != queue.Running {
				t.Fatalf("crash at write %d, nothing admitted: the first run's task %s, want running", n, st)
			}
		}
	}
	if second == "" {
		t.Fatal("no crash point stored the new run")
	}
	return second
}

// A server that dies after the transaction that admits a run with
// rollback, before it stopped the run before, and no join of the new
// run: a read of the thread's runs stops the old run (its task
// cancelled, its checkpoints deleted, its late write refused) and
// submits the new run's task, so the old run never runs on beside it.
func TestCrashAfterAdmissionStopsOnListing(t *testing.T) {
	a := newAPI(t)
	th := newThread(t, a)
	f := newFakeRuntime(t, a, true)
	first := createRun(a, th, "reject")
	<-f.started
	second := admitThenCrash(t, a, f, th, first, "rollback")
	a.must(200, "GET", "/threads/"+th+"/runs", nil)
	if st := taskStatus(t, f.q, first); st != queue.Cancelled {
		t.Fatalf("the stopped run's task after a read of the thread's runs: %s, want cancelled", st)
	}
	if n := checkpointsOf(t, a, th); n[first] != 0 {
		t.Fatalf("checkpoints by run %v: the rolled back run's were kept", n)
	}
	select {
	case got := <-f.started:
		if got != second {
			t.Fatalf("started %s, want %s", got, second)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the new run's task did not start in 30 s")
	}
	f.release(second)
	if st := joined(a, th, second); st != "success" {
		t.Fatalf("new run %s, want success", st)
	}
	if f.lateAccepted.Load() != 0 {
		t.Fatalf("%d late writes of the stopped run accepted", f.lateAccepted.Load())
	}
}

// taskStatus is task id's status.
func taskStatus(t *testing.T, q *queue.Client, id string) queue.Status {
	t.Helper()
	task, err := q.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return task.CurrentStatus
}
