package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// claimedTask is a store of namespace ns and the claim of task id in it,
// a lock of TTL 5 s that the test may release.
func claimedTask(ctx context.Context, t *testing.T, cli *clientv3.Client, ns, id string) (*task.Store, lease.Fence, func(context.Context) error) {
	t.Helper()
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	f, release, err := store.ClaimLock(ctx, locker, id)
	if err != nil {
		t.Fatal(err)
	}
	return store, f, release
}

// recordingSpawner stands in for a queue worker's spawner: it accepts
// every child and records what it was asked to submit.
type recordingSpawner struct {
	mu        sync.Mutex
	submitted [][]task.Child
}

func (s *recordingSpawner) CheckChildren(context.Context, []task.Child) error { return nil }

func (s *recordingSpawner) SubmitChildren(_ context.Context, _ string, _ int, children []task.Child) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.submitted = append(s.submitted, children)
	return nil
}

// A step that spawns, run again after its plan was written but not its
// checkpoint, spawns only the list of the run that checkpointed, however
// long the earlier list was; run again after the checkpoint, it does not
// run, and the children are submitted once. Once its children ended, the
// next step reads their outcomes.
func TestSpawnPlanIsIdempotentPerStep(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, f, release := claimedTask(ctx, t, cli, ns, "p")
	defer release(context.Background())

	// A first run planned 3,000 children (several chunks) and died.
	long := make([]task.Child, 3000)
	for i := range long {
		long[i] = task.Child{Queue: "q", Type: "x", Parameters: json.RawMessage(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 200)))}
	}
	if err := store.PlanOnly(ctx, f, "p", 1, long); err != nil {
		t.Fatal(err)
	}
	keys := keyspace.MustNew(ns)
	if g, _ := cli.Get(ctx, keys.ChildPlan("p", 1), clientv3.WithPrefix(), clientv3.WithCountOnly()); g.Count < 3 {
		t.Fatalf("the long plan took %d chunks; want several", g.Count)
	}

	runs := map[string]int{}
	steps := []task.Step{
		{Name: "fan-out", Run: func(context.Context, []byte) ([]byte, error) {
			runs["fan-out"]++
			return []byte(`"s"`), task.Spawn([]task.Child{{Queue: "q", Type: "x"}, {Queue: "q", Type: "x", Key: "k"}, {Queue: "q", Type: "x"}}, task.SpawnOptions{})
		}},
		{Name: "fan-in", Run: func(ctx context.Context, _ []byte) ([]byte, error) {
			runs["fan-in"]++
			out, err := task.Children(ctx)
			if err != nil {
				return nil, err
			}
			return json.Marshal(out)
		}},
	}
	sp := &recordingSpawner{}
	cfg := task.StepConfig{Worker: "w", Spawner: sp}
	for run := 1; run <= 2; run++ {
		res, err := store.RunSteps(ctx, f, "p", steps, cfg)
		if err != nil || res.Waiting == nil || res.Waiting.Children == nil || res.Waiting.Children.N != 3 || res.Waiting.Children.Wait != 3 {
			t.Fatalf("run %d: %+v (%v); want to wait for 3 children", run, res, err)
		}
	}
	if runs["fan-out"] != 1 || len(sp.submitted) != 1 || len(sp.submitted[0]) != 3 {
		t.Fatalf("fan-out ran %d times, submissions %v; want once, of 3 children", runs["fan-out"], sp.submitted)
	}
	want := []string{"p.1.0", "p.1.k", "p.1.2"}
	for i, c := range sp.submitted[0] {
		if c.ID != want[i] {
			t.Fatalf("child %d id %s; want %s", i, c.ID, want[i])
		}
	}
	plan, err := store.Plan(ctx, "p", 1)
	if err != nil || len(plan) != 3 {
		t.Fatalf("plan of %d children (%v); the long plan's chunks must be gone", len(plan), err)
	}

	// The children end (as a queue worker records it), and the next
	// step reads their outcomes.
	for _, id := range want {
		if _, err := cli.Put(ctx, keys.ChildDone("p", 1, id), `{"status":"SUCCEEDED","result":{"id":"`+id+`"}}`); err != nil {
			t.Fatal(err)
		}
	}
	res, err := store.RunSteps(ctx, f, "p", steps, cfg)
	if err != nil || res.Waiting != nil || runs["fan-in"] != 1 {
		t.Fatalf("run after the children: %+v (%v), fan-in ran %d times", res, err, runs["fan-in"])
	}
	var outs []task.ChildOutcome
	if err := json.Unmarshal(res.State, &outs); err != nil || len(outs) != 3 || outs[0].ID != "p.1.0" || string(outs[0].Result) != `{"id":"p.1.0"}` {
		t.Fatalf("outcomes %s (%v)", res.State, err)
	}
}

// Child ids stay within MaxIDLen however long the parent's id: a long
// one is cut and given a hash of itself, so two long parents that share
// a prefix get different children.
func TestChildIDOfALongParent(t *testing.T) {
	a, b := strings.Repeat("a", 119)+"1", strings.Repeat("a", 119)+"2"
	ca, cb := task.ChildID(a, 12, "345"), task.ChildID(b, 12, "345")
	if len(ca) > task.MaxIDLen || ca == cb || !strings.HasSuffix(ca, ".12.345") {
		t.Fatalf("child ids %q and %q", ca, cb)
	}
	if err := task.CheckID(ca); err != nil {
		t.Fatal(err)
	}
	if got := task.ChildID("p", 1, "0"); got != "p.1.0" {
		t.Fatalf("short parent: %q", got)
	}
	if got := task.ChildID("p", 1, strings.Repeat("k", 120)); got != "" {
		t.Fatalf("a key with no room: %q", got)
	}
}

// A run whose lock was lost while its step ran spawns nothing: the plan's
// first write is refused by the fence, and no plan, checkpoint or child
// is stored or submitted.
func TestSpawnUnderALostLockStoresNothing(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, f, release := claimedTask(ctx, t, cli, ns, "p")
	sp := &recordingSpawner{}
	steps := []task.Step{
		{Name: "fan-out", Run: func(context.Context, []byte) ([]byte, error) {
			if err := release(context.Background()); err != nil { // the lock is lost as the step runs
				return nil, err
			}
			return nil, task.Spawn([]task.Child{{Queue: "q", Type: "x"}}, task.SpawnOptions{})
		}},
		{Name: "fan-in", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }},
	}
	if _, err := store.RunSteps(ctx, f, "p", steps, task.StepConfig{Worker: "w", Spawner: sp}); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("run under a lost lock: %v; want lock.ErrFenced", err)
	}
	keys := keyspace.MustNew(ns)
	for _, k := range []string{keys.TaskChildren("p"), keys.TaskCheckpoint("p"), keys.TaskSteps("p")} {
		if g, _ := cli.Get(ctx, k, clientv3.WithPrefix(), clientv3.WithKeysOnly()); len(g.Kvs) != 0 {
			t.Fatalf("stored under a lost lock: %s", g.Kvs[0].Key)
		}
	}
	if len(sp.submitted) != 0 {
		t.Fatalf("children submitted: %v", sp.submitted)
	}
}
