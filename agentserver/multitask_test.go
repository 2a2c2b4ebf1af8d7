package agentserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fakeRuntime runs the namespace's runs as the TypeScript runtime does:
// it admits each on its thread with checkpoint.Admitter (the thread's
// lock), writes a checkpoint fenced by that lock with the run's id in its
// metadata, waits for the test to let the run go on (or for the run to be
// stopped), and reports the outcome under its claim. A run it finds
// stopped tries one more checkpoint write, which must be refused.
type fakeRuntime struct {
	t     *testing.T
	a     *api
	store *checkpoint.Etcd
	adm   *checkpoint.Admitter
	q     *queue.Client
	hold  bool // wait for release(run) before each run ends

	mu    sync.Mutex
	gates map[string]chan struct{}

	inside, maxInside         atomic.Int32 // runs between admission and outcome
	lateRefused, lateAccepted atomic.Int64 // writes of runs found stopped
	started                   chan string  // each run's id once it wrote its first checkpoint
}

func newFakeRuntime(t *testing.T, a *api, hold bool) *fakeRuntime {
	t.Helper()
	ctx := context.Background()
	locker, err := lock.NewEtcd(ctx, a.cli, lock.EtcdConfig{Namespace: a.ns, TTL: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close(ctx) })
	adm, err := checkpoint.NewAdmitter(a.cli, a.ns, locker)
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.NewEtcd(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close(ctx) })
	f := &fakeRuntime{t: t, a: a, store: store, adm: adm, q: q, hold: hold, gates: map[string]chan struct{}{}, started: make(chan string, 64)} // more than a test starts
	runtime(t, a, f.run)
	return f
}

func (f *fakeRuntime) gate(id string) chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gates[id] == nil {
		f.gates[id] = make(chan struct{})
	}
	return f.gates[id]
}

// release lets run id end.
func (f *fakeRuntime) release(id string) { close(f.gate(id)) }

func (f *fakeRuntime) put(thread, id string, l lock.Lock) error {
	_, err := f.store.Append(context.Background(), checkpoint.Checkpoint{ThreadID: thread,
		Metadata: checkpoint.MetadataOf(map[string]json.RawMessage{"run_id": json.RawMessage(fmt.Sprintf("%q", id))}), State: []byte(`{}`)}, l)
	return err
}

func (f *fakeRuntime) run(ctx context.Context, p map[string]any, token int64) []byte {
	run, _ := p["run"].(map[string]any)
	thread, id := run["thread_id"].(string), run["run_id"].(string)
	adm, err := f.adm.Admit(ctx, thread, checkpoint.Enqueue)
	if err != nil {
		return []byte(`{"status":"error"}`)
	}
	defer func() { _ = adm.Release(context.Background()) }()
	if t, err := f.q.Get(ctx, id); err != nil || t.CurrentStatus == queue.Cancelled { // stopped before it was admitted
		return []byte(`{"status":"interrupted"}`)
	}
	n := f.inside.Add(1)
	defer f.inside.Add(-1)
	for m := f.maxInside.Load(); n > m && !f.maxInside.CompareAndSwap(m, n); m = f.maxInside.Load() {
	}
	stopped := func() []byte {
		<-adm.Context().Done() // the server took the lock (or wrote the interrupt key)
		if f.put(thread, id, adm.Lock) == nil {
			f.lateAccepted.Add(1)
		} else {
			f.lateRefused.Add(1)
		}
		return []byte(`{"status":"interrupted"}`)
	}
	if err := f.put(thread, id, adm.Lock); err != nil {
		return stopped()
	}
	f.started <- id
	if f.hold {
		select {
		case <-f.gate(id):
		case <-adm.Context().Done():
			return stopped()
		}
	}
	body := map[string]any{"token": token, "status": "success", "state": valuesState(map[string]any{"run": id})}
	if ans := f.a.do("PUT", "/v1/agent-server/threads/"+thread+"/runs/"+id+"/outcome", body); ans.Status == 409 {
		return stopped()
	}
	return nil
}

// runsOf counts thread's run records: admitted and not ended, queued.
func runsOf(t *testing.T, a *api, thread string) (admitted, queued int) {
	t.Helper()
	resp, err := a.cli.Get(context.Background(), keyspace.MustNew(a.ns).AgentRuns(thread), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		var r map[string]any
		_ = json.Unmarshal(kv.Value, &r)
		switch {
		case r["ended"] == true:
		case r["queued"] == true:
			queued++
		default:
			admitted++
		}
	}
	return admitted, queued
}

// checkpointsOf counts thread's checkpoints by the run that wrote them.
func checkpointsOf(t *testing.T, a *api, thread string) map[string]int {
	t.Helper()
	store, _ := checkpoint.NewEtcd(a.cli, a.ns)
	cps, err := store.List(context.Background(), thread, "", checkpoint.ListOptions{AllNamespaces: true, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, cp := range cps {
		var m map[string]any
		raw, _ := json.Marshal(cp.Metadata)
		_ = json.Unmarshal(raw, &m)
		id, _ := m["run_id"].(string)
		out[id]++
	}
	return out
}

func newThread(t *testing.T, a *api) string {
	t.Helper()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	return a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
}

func createRun(a *api, th, strategy string) string {
	a.t.Helper()
	return a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "multitask_strategy": strategy}).Obj["run_id"].(string)
}

// joined waits for run id (join) and answers its status.
func joined(a *api, th, id string) string {
	a.t.Helper()
	a.must(200, "GET", "/threads/"+th+"/runs/"+id+"/join", nil)
	return a.must(200, "GET", "/threads/"+th+"/runs/"+id, nil).Obj["status"].(string)
}

// enqueue: the second run waits pending, with no task, until the first
// ends; then it runs.
func TestEnqueueWaitsForTheActiveRun(t *testing.T) {
	a := newAPI(t)
	th := newThread(t, a)
	f := newFakeRuntime(t, a, true)
	first := createRun(a, th, "reject")
	if got := <-f.started; got != first {
		t.Fatalf("started %s, want %s", got, first)
	}
	second := createRun(a, th, "enqueue")
	a.must(409, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"})
	if st := a.must(200, "GET", "/threads/"+th+"/runs/"+second, nil).Obj["status"]; st != "pending" {
		t.Fatalf("enqueued run %v, want pending", st)
	}
	if _, err := f.q.Get(context.Background(), second); err == nil {
		t.Fatal("an enqueued run has its task before the active run ended")
	}
	if adm, queued := runsOf(t, a, th); adm != 1 || queued != 1 {
		t.Fatalf("admitted %d, queued %d: want 1 and 1", adm, queued)
	}
	f.release(first)
	if got := <-f.started; got != second {
		t.Fatalf("started %s, want %s", got, second)
	}
	f.release(second)
	if st := joined(a, th, first); st != "success" {
		t.Fatalf("first run %s, want success", st)
	}
	if st := joined(a, th, second); st != "success" {
		t.Fatalf("enqueued run %s, want success", st)
	}
	if n := checkpointsOf(t, a, th); n[first] != 1 || n[second] != 1 {
		t.Fatalf("checkpoints by run %v: want one each", n)
	}
	if m := f.maxInside.Load(); m != 1 {
		t.Fatalf("%d runs inside at once", m)
	}
}

// interrupt: the active run ends interrupted, keeps its checkpoints, and
// its late checkpoint write is refused; the new run runs.
func TestInterruptStopsTheActiveRun(t *testing.T) {
	a := newAPI(t)
	th := newThread(t, a)
	f := newFakeRuntime(t, a, true)
	first := createRun(a, th, "reject")
	<-f.started
	second := createRun(a, th, "interrupt")
	if st := a.must(200, "GET", "/threads/"+th+"/runs/"+first, nil).Obj["status"]; st != "interrupted" {
		t.Fatalf("interrupted run %v", st)
	}
	if got := <-f.started; got != second {
		t.Fatalf("started %s, want %s", got, second)
	}
	f.release(second)
	if st := joined(a, th, second); st != "success" {
		t.Fatalf("new run %s, want success", st)
	}
	if f.lateRefused.Load() != 1 || f.lateAccepted.Load() != 0 {
		t.Fatalf("late writes of the stopped run: %d refused, %d accepted; want 1 and 0", f.lateRefused.Load(), f.lateAccepted.Load())
	}
	if n := checkpointsOf(t, a, th); n[first] != 1 || n[second] != 1 {
		t.Fatalf("checkpoints by run %v: want the interrupted run's kept", n)
	}
	if st := a.must(200, "GET", "/threads/"+th, nil).Obj["status"]; st != "idle" {
		t.Fatalf("thread %v, want idle", st)
	}
}

// rollback: the active run is deleted with its checkpoints, and its late
// write is refused; the new run runs.
func TestRollbackDeletesTheActiveRun(t *testing.T) {
	a := newAPI(t)
	th := newThread(t, a)
	f := newFakeRuntime(t, a, true)
	first := createRun(a, th, "reject")
	<-f.started
	second := createRun(a, th, "rollback")
	a.must(404, "GET", "/threads/"+th+"/runs/"+first, nil)
	if got := <-f.started; got != second {
		t.Fatalf("started %s, want %s", got, second)
	}
	f.release(second)
	if st := joined(a, th, second); st != "success" {
		t.Fatalf("new run %s, want success", st)
	}
	if f.lateRefused.Load() != 1 || f.lateAccepted.Load() != 0 {
		t.Fatalf("late writes of the stopped run: %d refused, %d accepted; want 1 and 0", f.lateRefused.Load(), f.lateAccepted.Load())
	}
	if n := checkpointsOf(t, a, th); n[first] != 0 || n[second] != 1 {
		t.Fatalf("checkpoints by run %v: want the rolled back run's gone", n)
	}
}

// Concurrent creates on one thread, every strategy: never two runs
// admitted at once (counted on every change of the thread's run records),
// and every late write of a stopped run refused.
func TestConcurrentCreatesKeepOneActiveRun(t *testing.T) {
	a := newAPI(t)
	a.hc.Timeout = 5 * time.Minute // creates that stop runs queue behind each other on a loaded machine
	th := newThread(t, a)
	f := newFakeRuntime(t, a, false)
	wctx, stop := context.WithCancel(context.Background())
	defer stop()
	var maxAdmitted atomic.Int32
	watched := make(chan struct{})
	go func() { // every revision of the thread's run records
		defer close(watched)
		prefix := keyspace.MustNew(a.ns).AgentRuns(th)
		recs := map[string]map[string]any{}
		for wr := range a.cli.Watch(wctx, prefix, clientv3.WithPrefix()) {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					delete(recs, string(ev.Kv.Key))
					continue
				}
				var r map[string]any
				_ = json.Unmarshal(ev.Kv.Value, &r)
				recs[string(ev.Kv.Key)] = r
			}
			n := int32(0)
			for _, r := range recs {
				if r["ended"] != true && r["queued"] != true {
					n++
				}
			}
			if n > maxAdmitted.Load() {
				maxAdmitted.Store(n)
			}
		}
	}()
	strategies := []string{"enqueue", "interrupt", "rollback", "reject"}
	var wg sync.WaitGroup
	var created sync.Map
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ans := a.do("POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "multitask_strategy": strategies[i%4]})
			if ans.Status == 200 {
				created.Store(ans.Obj["run_id"].(string), strategies[i%4])
			} else if ans.Status != 409 {
				t.Errorf("create %s: %d %s", strategies[i%4], ans.Status, ans.Raw)
			}
		}()
	}
	wg.Wait()
	created.Range(func(k, _ any) bool { // every run ends (or was rolled back)
		if ans := a.do("GET", "/threads/"+th+"/runs/"+k.(string)+"/join", nil); ans.Status != 200 && ans.Status != 404 {
			t.Errorf("join %s: %d %s", k, ans.Status, ans.Raw)
		}
		return true
	})
	if adm, queued := runsOf(t, a, th); adm != 0 || queued != 0 {
		t.Fatalf("after all joins: %d admitted, %d queued", adm, queued)
	}
	stop()
	<-watched
	if m := maxAdmitted.Load(); m > 1 {
		t.Fatalf("%d runs admitted at once on one thread", m)
	}
	// Runs inside the runtime at once are not counted here: a stopped
	// run's lock is taken from it (its key deleted) before the next run
	// is admitted, and its goroutine learns of it a moment later, from
	// its lock's watch, while the next one may already be inside. That
	// window is what the fence is for: what must hold is that no write
	// of a stopped run lands.
	if f.lateAccepted.Load() != 0 {
		t.Fatalf("%d late writes of stopped runs accepted (%d refused)", f.lateAccepted.Load(), f.lateRefused.Load())
	}
	t.Logf("late writes refused: %d", f.lateRefused.Load())
}

// A run admitted whose task is not submitted yet, stopped by an
// interrupt, never runs: its create's late submit finds its id taken by a
// cancelled task.
func TestInterruptBeforeTheTaskKeepsTheLateSubmitOut(t *testing.T) {
	a := newAPI(t)
	th := newThread(t, a)
	strandRun(t, a, th, "run-late", time.Now())
	createRun(a, th, "interrupt")
	if r := storedRun(t, a, th, "run-late"); r["ended"] != true || r["status"] != "interrupted" {
		t.Fatalf("stopped run %v: want ended interrupted", r)
	}
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = q.Close(context.Background()) }()
	ctx := context.Background()
	_, _ = q.Submit(ctx, agentserver.RunsQueue, []queue.Task{{ID: "run-late", Type: "agent", Parameters: json.RawMessage(`{"run":{"run_id":"run-late"}}`)}}, nil)
	task, err := q.Get(ctx, "run-late")
	if err != nil {
		t.Fatal(err)
	}
	if task.CurrentStatus != queue.Cancelled {
		t.Fatalf("the stopped run's late task is %s, want cancelled", task.CurrentStatus)
	}
}

// An enqueued run stranded without an active run before it (the end of
// that run admitted none) is admitted by the next create, which then
// finds it active.
func TestCreateAdmitsAStrandedEnqueuedRun(t *testing.T) {
	a := newAPI(t)
	th := newThread(t, a)
	strandRun(t, a, th, "run-queued", time.Now())
	sp := keyspace.MustNew(a.ns)
	r := storedRun(t, a, th, "run-queued")
	r["queued"], r["multitask_strategy"] = true, "enqueue"
	r["params"] = map[string]any{"run": map[string]any{"run_id": "run-queued", "thread_id": th}, "graph_id": "agent"}
	raw, _ := json.Marshal(r)
	if _, err := a.cli.Put(context.Background(), sp.AgentRun(th, "run-queued"), string(raw)); err != nil {
		t.Fatal(err)
	}
	a.must(409, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"})
	if r := storedRun(t, a, th, "run-queued"); r["queued"] == true {
		t.Fatalf("stranded run %v: want admitted", r)
	}
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = q.Close(context.Background()) }()
	if _, err := q.Get(context.Background(), "run-queued"); err != nil {
		t.Fatalf("the admitted run's task: %v", err)
	}
}
