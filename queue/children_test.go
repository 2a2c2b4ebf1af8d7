package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// family is a parent queue "wf" whose tasks spawn children into queue
// "kids" at their first step and read their outcomes at their second,
// with each step's and each child's runs counted.
type family struct {
	mu       sync.Mutex
	steps    map[string]int // "{parent}/{step}" → runs
	kids     map[string]int // child id → attempts
	outcomes map[string][]task.ChildOutcome
	// children makes the list a parent spawns; opts its options.
	children func(parent string) []task.Child
	opts     task.SpawnOptions
	// child runs a child (after its attempt is counted).
	child func(ctx context.Context, t *queue.Task) ([]byte, error)
}

func newFamily(n int) *family {
	f := &family{steps: map[string]int{}, kids: map[string]int{}, outcomes: map[string][]task.ChildOutcome{}}
	f.children = func(string) []task.Child {
		out := make([]task.Child, n)
		for i := range out {
			out[i] = task.Child{Queue: "kids", Type: "search", Parameters: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		}
		return out
	}
	f.child = func(_ context.Context, t *queue.Task) ([]byte, error) { return t.Parameters, nil }
	return f
}

func (f *family) count(m map[string]int, k string) {
	f.mu.Lock()
	m[k]++
	f.mu.Unlock()
}

func (f *family) runs(m map[string]int, k string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[k]
}

func (f *family) parentSteps(id string) []task.Step {
	return []task.Step{
		{Name: "fan-out", Run: func(ctx context.Context, state []byte) ([]byte, error) {
			f.count(f.steps, id+"/fan-out")
			return []byte(`"spawned"`), task.Spawn(f.children(id), f.opts)
		}},
		{Name: "fan-in", Run: func(ctx context.Context, state []byte) ([]byte, error) {
			f.count(f.steps, id+"/fan-in")
			out, err := task.Children(ctx)
			if err != nil {
				return nil, err
			}
			f.mu.Lock()
			f.outcomes[id] = out
			f.mu.Unlock()
			return json.Marshal(len(out))
		}},
	}
}

// start runs a worker of "wf" (step tasks, their ids' steps) and one of
// "kids" until the test ends.
func (f *family) start(t *testing.T, cli *clientv3.Client, ns string) {
	t.Helper()
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	parents := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf", Concurrency: 4})
	parents.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		return queue.Steps(store, f.parentSteps(tk.ID)...)(ctx, tk)
	})
	kids := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "kids", Concurrency: 64,
		BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	kids.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		f.count(f.kids, tk.ID)
		return f.child(ctx, tk)
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, w := range []*queue.Worker{parents, kids} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// setup makes queue "kids" exist and submits parents ids to "wf".
func setupFamily(t *testing.T, c *queue.Client, ids ...string) {
	t.Helper()
	ctx := context.Background()
	if err := c.SetConfig(ctx, "kids", queue.Config{}); err != nil {
		t.Fatal(err)
	}
	var ts []queue.Task
	for _, id := range ids {
		ts = append(ts, queue.Task{ID: id, Type: "agent"})
	}
	if _, err := c.Submit(ctx, "wf", ts, nil); err != nil {
		t.Fatal(err)
	}
}

func waitFinished(t *testing.T, c *queue.Client, id string) *queue.Task {
	t.Helper()
	var got *queue.Task
	waitUntil(t, id+" to finish", func() bool {
		var err error
		got, err = c.Get(context.Background(), id)
		return err == nil && got.CurrentStatus.Terminal()
	})
	return got
}

// A step spawns 50 children into another queue and the next step gets
// every outcome: each child runs once (one fails once and succeeds on its
// retry, from a record of its own; the others succeed in their segment),
// each parent step runs once, and each child carries its parent.
func TestSpawnFanOutFanIn(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	f := newFamily(50)
	var failedOnce atomic.Bool
	f.child = func(_ context.Context, tk *queue.Task) ([]byte, error) {
		if tk.ID == "p.1.7" && failedOnce.CompareAndSwap(false, true) {
			return nil, errors.New("flaky search")
		}
		return tk.Parameters, nil
	}
	setupFamily(t, c, "p")
	f.start(t, cli, ns)
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != "50" {
		t.Fatalf("parent %s with result %s (%s); want SUCCEEDED with 50 outcomes", got.CurrentStatus, got.Result, got.LastError)
	}
	for _, s := range []string{"p/fan-out", "p/fan-in"} {
		if n := f.runs(f.steps, s); n != 1 {
			t.Fatalf("step %s ran %d times; want once", s, n)
		}
	}
	seen := map[string]bool{}
	for _, o := range f.outcomes["p"] {
		if o.Status != task.ChildSucceeded {
			t.Fatalf("outcome %+v", o)
		}
		var v struct{ N int }
		if err := json.Unmarshal(o.Result, &v); err != nil || o.ID != task.ChildID("p", 1, fmt.Sprint(v.N)) {
			t.Fatalf("outcome %+v (%v): its result is not its own", o, err)
		}
		seen[o.ID] = true
	}
	if len(seen) != 50 {
		t.Fatalf("%d distinct children in the outcomes", len(seen))
	}
	for i := range 50 {
		id := task.ChildID("p", 1, fmt.Sprint(i))
		want := 1
		if id == "p.1.7" {
			want = 2
		}
		if n := f.runs(f.kids, id); n != want {
			t.Fatalf("child %s ran %d times; want %d", id, n, want)
		}
		ch, err := c.Get(context.Background(), id)
		if err != nil || ch.Parent != "p" || ch.ParentStep != 1 || ch.CurrentStatus != queue.Succeeded {
			t.Fatalf("child %s: %+v (%v)", id, ch, err)
		}
	}
}

// With Wait set, the next step runs once that many children ended: it
// sees them, and the others run on.
func TestSpawnWaitsForTheFirstN(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	f := newFamily(10)
	f.opts = task.SpawnOptions{Wait: 3}
	release := make(chan struct{})
	f.child = func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		var v struct{ N int }
		_ = json.Unmarshal(tk.Parameters, &v)
		if v.N >= 3 {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return tk.Parameters, nil
	}
	setupFamily(t, c, "p")
	f.start(t, cli, ns)
	got := waitFinished(t, c, "p")
	close(release)
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != "3" {
		t.Fatalf("parent %s with result %s (%s); want SUCCEEDED having seen 3 outcomes", got.CurrentStatus, got.Result, got.LastError)
	}
	if n := f.runs(f.steps, "p/fan-in"); n != 1 {
		t.Fatalf("fan-in ran %d times", n)
	}
	for i := range 10 {
		waitFinished(t, c, task.ChildID("p", 1, fmt.Sprint(i)))
	}
}

// By default the first child that dies fails its parent, whose next step
// never runs; with Collect, the parent gets every outcome, the dead one's
// error among them.
func TestSpawnFailFastAndCollect(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	f := newFamily(5)
	f.child = func(_ context.Context, tk *queue.Task) ([]byte, error) {
		if strings.HasSuffix(tk.ID, ".1.2") {
			return nil, queue.Permanent(errors.New("no such page"))
		}
		return tk.Parameters, nil
	}
	f.children = func(parent string) []task.Child {
		out := make([]task.Child, 5)
		for i := range out {
			out[i] = task.Child{Queue: "kids", Type: "search"}
		}
		return out
	}
	setupFamily(t, c, "fast")
	f.start(t, cli, ns)
	got := waitFinished(t, c, "fast")
	if got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, "fast.1.2") || !strings.Contains(got.LastError, "no such page") {
		t.Fatalf("parent %s (%s); want DEAD naming its dead child and its error", got.CurrentStatus, got.LastError)
	}
	if got.Attempt != 1 {
		t.Fatalf("parent took %d attempts; a dead child fails it for good", got.Attempt)
	}
	if n := f.runs(f.steps, "fast/fan-in"); n != 0 {
		t.Fatalf("fan-in ran %d times after a child died", n)
	}

	f.opts = task.SpawnOptions{Collect: true}
	if _, err := c.Submit(context.Background(), "wf", []queue.Task{{ID: "all", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	got = waitFinished(t, c, "all")
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != "5" {
		t.Fatalf("parent %s with %s (%s); want SUCCEEDED with 5 outcomes", got.CurrentStatus, got.Result, got.LastError)
	}
	dead := 0
	for _, o := range f.outcomes["all"] {
		if o.Status == task.ChildDead {
			dead++
			if o.ID != "all.1.2" || !strings.Contains(o.Error, "no such page") {
				t.Fatalf("dead outcome %+v", o)
			}
		}
	}
	if dead != 1 {
		t.Fatalf("outcomes %+v: want one DEAD", f.outcomes["all"])
	}
}

// Spawning into a queue that does not exist, waiting for more children
// than spawned, or two children with one key: the parent fails with an
// error naming the field, and nothing of the spawn is stored.
func TestSpawnBadInput(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	f := newFamily(0)
	f.children = func(parent string) []task.Child {
		switch parent {
		case "noqueue":
			return []task.Child{{Queue: "kids", Type: "x"}, {Queue: "nowhere", Type: "x"}}
		case "prio":
			return []task.Child{{Queue: "kids", Type: "x", Priority: 5000}}
		case "toomany":
			f.opts = task.SpawnOptions{Wait: 3}
			return []task.Child{{Queue: "kids", Type: "x"}}
		}
		return []task.Child{{Queue: "kids", Type: "x", Key: "a"}, {Queue: "kids", Type: "x", Key: "a"}}
	}
	setupFamily(t, c)
	f.start(t, cli, ns)
	for id, want := range map[string]string{"noqueue": "children[1].queue", "toomany": "wait", "dupkey": "children[1].key", "prio": "children[0].priority"} {
		f.opts = task.SpawnOptions{}
		if _, err := c.Submit(context.Background(), "wf", []queue.Task{{ID: id, Type: "agent"}}, nil); err != nil {
			t.Fatal(err)
		}
		got := waitFinished(t, c, id)
		if got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, want) || got.Attempt != 1 {
			t.Fatalf("%s: %s attempt %d (%s); want DEAD at once naming %s", id, got.CurrentStatus, got.Attempt, got.LastError, want)
		}
		if g, _ := cli.Get(context.Background(), keys.TaskChildren(id), clientv3.WithPrefix(), clientv3.WithCountOnly()); g.Count != 0 {
			t.Fatalf("%s: %d child keys stored", id, g.Count)
		}
	}
	if st, _ := c.Stats(context.Background(), "kids"); st.Total() != 0 {
		t.Fatalf("kids got tasks: %+v", st)
	}
}

// Cancelling a waiting parent, by its id or in bulk, cancels its live
// children, except the detached one; the cancels are recorded for the
// parent.
func TestCancelParentCancelsChildren(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	f := newFamily(0)
	f.children = func(string) []task.Child {
		return []task.Child{{Queue: "idle", Type: "x"}, {Queue: "idle", Type: "x"}, {Queue: "idle", Type: "x", Key: "keep", Detached: true}}
	}
	ctx := context.Background()
	if err := c.SetConfig(ctx, "idle", queue.Config{}); err != nil { // no worker runs it
		t.Fatal(err)
	}
	setupFamily(t, c, "boss", "bulk")
	f.start(t, cli, ns)
	waitUntil(t, "the parents to wait", func() bool {
		st, err := c.Stats(ctx, "idle")
		wf, werr := c.Stats(ctx, "wf")
		return err == nil && werr == nil && st.Pending == 6 && wf.Waiting == 2
	})
	if _, err := c.Cancel(ctx, "boss"); err != nil {
		t.Fatal(err)
	}
	if n, err := c.CancelTasks(ctx, "wf", queue.Waiting, []string{"bulk"}, nil); err != nil || n != 1 {
		t.Fatalf("bulk cancel: %d (%v)", n, err)
	}
	store, _ := task.NewStore(cli, ns)
	for _, p := range []string{"boss", "bulk"} {
		for _, id := range []string{p + ".1.0", p + ".1.1"} {
			if got, err := c.Get(ctx, id); err != nil || got.CurrentStatus != queue.Cancelled {
				t.Fatalf("child %s: %+v (%v); want CANCELLED", id, got, err)
			}
		}
		if got, err := c.Get(ctx, p+".1.keep"); err != nil || got.CurrentStatus != queue.Pending {
			t.Fatalf("detached child of %s: %+v (%v); want PENDING", p, got, err)
		}
		outs, _, err := store.ChildrenOf(ctx, p, 1, "", 10)
		if err != nil || len(outs) != 2 || outs[0].Status != task.ChildCancelled {
			t.Fatalf("outcomes of %s: %+v (%v); want the two cancels", p, outs, err)
		}
	}
}

// A parent's park is conditional: a child that ends between the parent's
// count of its children and its park makes the park refused, and the
// parent goes back to pending at once. With every wake skipped, that
// alone brings the parent back here: it resumes, once.
func TestSpawnParkRefusedWhenAChildEndsFirst(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	queue.SetChildHooks(nil, func(string) bool { return false }, func(parent string) {
		// Park only once every child ended, after the count.
		waitUntil(t, "the children to end", func() bool {
			g, err := cli.Get(context.Background(), keys.ChildDones(parent, 1), clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err == nil && g.Count == 3
		})
	})
	t.Cleanup(func() { queue.SetChildHooks(nil, nil, nil) })
	f := newFamily(3)
	setupFamily(t, c, "p")
	f.start(t, cli, ns)
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != "3" {
		t.Fatalf("parent %s with %s (%s)", got.CurrentStatus, got.Result, got.LastError)
	}
	if a, b := f.runs(f.steps, "p/fan-out"), f.runs(f.steps, "p/fan-in"); a != 1 || b != 1 {
		t.Fatalf("fan-out ran %d times and fan-in %d; want once each", a, b)
	}
	for _, tr := range got.Transitions {
		if tr.Status == queue.Waiting {
			t.Fatalf("the parent parked: %+v", got.Transitions)
		}
	}
}

// A last step that spawns: the task waits for its children and then
// succeeds with that step's state, without running anything more.
func TestSpawnFromTheLastStep(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	f := newFamily(4)
	setupFamily(t, c, "last")
	var runs atomic.Int32
	parents := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf"})
	parents.HandleAll(queue.Steps(store, task.Step{Name: "only", Run: func(context.Context, []byte) ([]byte, error) {
		runs.Add(1)
		return []byte(`"dispatched"`), task.Spawn(f.children("last"), task.SpawnOptions{})
	}}))
	kids := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "kids", Concurrency: 8})
	release := make(chan struct{})
	kids.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		select {
		case <-release:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, w := range []*queue.Worker{parents, kids} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()
	waitUntil(t, "the task to wait", func() bool {
		p, err := c.Get(ctx, "last")
		return err == nil && p.CurrentStatus == queue.Waiting
	})
	close(release)
	got := waitFinished(t, c, "last")
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != `"dispatched"` || runs.Load() != 1 {
		t.Fatalf("task %s with %s (%s), its step ran %d times", got.CurrentStatus, got.Result, got.LastError, runs.Load())
	}
	for i := range 4 {
		if ch, err := c.Get(ctx, task.ChildID("last", 1, fmt.Sprint(i))); err != nil || ch.CurrentStatus != queue.Succeeded {
			t.Fatalf("child %d: %+v (%v)", i, ch, err)
		}
	}
}

// A cancel cascades down the generations: the root's child, itself a step
// task waiting for children of its own, is cancelled, and so are they.
func TestCancelCascadesToGrandchildren(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"mid", "idle"} {
		if err := c.SetConfig(ctx, q, queue.Config{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Submit(ctx, "wf", []queue.Task{{ID: "root", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	spawner := func(q string, n int) []task.Step {
		return []task.Step{
			{Name: "spawn", Run: func(context.Context, []byte) ([]byte, error) {
				kids := make([]task.Child, n)
				for i := range kids {
					kids[i] = task.Child{Queue: q, Type: "x"}
				}
				return nil, task.Spawn(kids, task.SpawnOptions{})
			}},
			{Name: "after", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }},
		}
	}
	var workers []*queue.Worker
	for q, steps := range map[string][]task.Step{"wf": spawner("mid", 1), "mid": spawner("idle", 2)} {
		w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q})
		w.HandleAll(queue.Steps(store, steps...))
		workers = append(workers, w)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(rctx) }()
	}
	defer func() { cancel(); wg.Wait() }()
	waitUntil(t, "two generations to wait", func() bool {
		r, err1 := c.Get(ctx, "root")
		m, err2 := c.Get(ctx, "root.1.0")
		st, err3 := c.Stats(ctx, "idle")
		return err1 == nil && err2 == nil && err3 == nil && r.CurrentStatus == queue.Waiting && m.CurrentStatus == queue.Waiting && st.Pending == 2
	})
	if _, err := c.Cancel(ctx, "root"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"root.1.0", "root.1.0.1.0", "root.1.0.1.1"} {
		if got, err := c.Get(ctx, id); err != nil || got.CurrentStatus != queue.Cancelled {
			t.Fatalf("%s: %+v (%v); want CANCELLED", id, got, err)
		}
	}
}
