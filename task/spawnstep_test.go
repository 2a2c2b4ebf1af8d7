package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/task"
)

// spawnList is n children keyed prefix0..prefix{n-1}, padded so that a
// few thousand take several plan chunks.
func spawnList(prefix string, n int) []task.Child {
	out := make([]task.Child, n)
	for i := range out {
		out[i] = task.Child{Key: fmt.Sprintf("%s%d", prefix, i), Queue: "q", Type: "x", Parameters: json.RawMessage(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 200)))}
	}
	return out
}

// commitSpawnWrite writes step 1 of task id as spawning list, from prev,
// as an HTTP agent task's spawn write does.
func commitSpawnWrite(ctx context.Context, store *task.Store, f lease.Fence, prev task.Checkpoint, id string, state []byte, list []task.Child) error {
	now := time.Now().UTC()
	next := task.Checkpoint{TaskID: id, Step: 1, StepName: "fan", Steps: 2, State: state, Worker: "w", Token: f.Token(), At: now}
	rec := task.StepRecord{Step: 1, Name: "fan", Worker: "w", Token: f.Token(), StartedAt: now, FinishedAt: now}
	return store.CommitSpawn(ctx, f, &recordingSpawner{}, prev, &next, rec, nil, &task.SpawnRequest{Children: append([]task.Child(nil), list...)})
}

// planIs fails t unless the plan of step 1 of task id lists exactly the
// children keyed prefix0..prefix{n-1} and the checkpoint records n.
func planIs(ctx context.Context, t *testing.T, store *task.Store, id, prefix string, n int) {
	t.Helper()
	plan, err := store.Plan(ctx, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != n {
		t.Fatalf("%s: the plan lists %d children; want the %d of the write that committed", id, len(plan), n)
	}
	for i, c := range plan {
		if want := task.ChildID(id, 1, fmt.Sprintf("%s%d", prefix, i)); c.ID != want {
			t.Fatalf("%s: plan entry %d is %s; want %s (a mix of two writes' lists)", id, i, c.ID, want)
		}
	}
	cp, err := store.Load(ctx, id)
	if err != nil || cp.Spawn == nil || cp.Spawn.N != n {
		t.Fatalf("%s: checkpoint %+v (%v); want a spawn of %d", id, cp.Spawn, err, n)
	}
}

// TestSpawnWriteAfterCommitUnderOneClaim: a second spawn write of a step
// under the same claim, from the same checkpoint (a client's retry that
// lost to its first write), is refused and leaves the committed plan as
// it was, with a small state and with a state and last plan chunk so
// large that every plan chunk is written apart from the checkpoint.
func TestSpawnWriteAfterCommitUnderOneClaim(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range []struct {
		id    string
		state []byte
	}{{"small", []byte(`"s"`)}, {"large", []byte(`"` + strings.Repeat("s", 450<<10) + `"`)}} {
		store, f, release := claimedTask(ctx, t, cli, ns, c.id)
		prev, err := store.Load(ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		first := spawnList("a", 3001)
		if c.id == "large" { // a last chunk of its own of 320 KiB: 4/3 of the state and it pass 900 KiB
			first[3000].Parameters = json.RawMessage(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 320<<10)))
		}
		if err := commitSpawnWrite(ctx, store, f, prev, c.id, c.state, first); err != nil {
			t.Fatalf("%s: first write: %v", c.id, err)
		}
		if err := commitSpawnWrite(ctx, store, f, prev, c.id, c.state, spawnList("b", 2000)); !errors.Is(err, task.ErrConflict) {
			t.Fatalf("%s: second write from the same checkpoint: %v; want ErrConflict", c.id, err)
		}
		planIs(ctx, t, store, c.id, "a", 3001)
		_ = release(ctx)
	}
}

// TestSpawnWritesRaceUnderOneClaim: two spawn writes of a step under one
// claim at once, with different lists: at most one commits, and the plan
// is that one's list, never a mix.
func TestSpawnWritesRaceUnderOneClaim(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for round := 0; round < 6; round++ {
		id := fmt.Sprintf("race%d", round)
		store, f, release := claimedTask(ctx, t, cli, ns, id)
		prev, err := store.Load(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		lists := map[string]int{"a": 3000, "b": 2500}
		errs := map[string]error{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for prefix, n := range lists {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := commitSpawnWrite(ctx, store, f, prev, id, []byte(`"s"`), spawnList(prefix, n))
				mu.Lock()
				errs[prefix] = err
				mu.Unlock()
			}()
		}
		wg.Wait()
		won := ""
		for prefix, err := range errs {
			switch {
			case err == nil && won != "":
				t.Fatalf("%s: both writes committed", id)
			case err == nil:
				won = prefix
			case !errors.Is(err, task.ErrConflict):
				t.Fatalf("%s: write %s: %v", id, prefix, err)
			}
		}
		if won != "" {
			planIs(ctx, t, store, id, won, lists[won])
		}
		_ = release(ctx)
	}
}

// TestInheritedEnvDropsStepFiles: the files and signal of the step that
// runs a process are not handed on; everything else is, DROVER_STEP and
// a DROVER_ variable that is not a file included.
func TestInheritedEnvDropsStepFiles(t *testing.T) {
	in := []string{"PATH=/bin", "DROVER_SIGNAL_FILE=/s", "DROVER_SIGNAL_NAME=go", "DROVER_CHILDREN_FILE=/c", "DROVER_WAIT_FILE=/w",
		"DROVER_SPAWN_FILE=/p", "DROVER_SLEEP_FILE=/z", "DROVER_STATE_FILE=/st", "DROVER_STEP=2", "DROVER_NAMESPACE=ns", "MY_FILE=/m"}
	got := strings.Join(task.InheritedEnv(in), " ")
	if want := "PATH=/bin DROVER_STEP=2 DROVER_NAMESPACE=ns MY_FILE=/m"; got != want {
		t.Fatalf("inherited %q; want %q", got, want)
	}
}

// TestPlainCommitDropsUncommittedPlan: a spawn write of a step that did
// not commit left its plan; the step's commit without a spawn deletes
// it, so that no reader takes it for the step's children.
func TestPlainCommitDropsUncommittedPlan(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, f, release := claimedTask(ctx, t, cli, ns, "p8")
	defer release(context.Background())
	if err := store.PlanOnly(ctx, f, "p8", 1, spawnList("a", 3)); err != nil {
		t.Fatal(err)
	}
	prev, err := store.Load(ctx, "p8")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	next := task.Checkpoint{TaskID: "p8", Step: 1, Steps: 2, State: []byte(`"s"`), At: now}
	if err := store.Commit(ctx, f, prev, &next, task.StepRecord{Step: 1, StartedAt: now, FinishedAt: now}); err != nil {
		t.Fatal(err)
	}
	if plan, err := store.Plan(ctx, "p8", 1); err != nil || len(plan) != 0 {
		t.Fatalf("plan of %d children (%v) after a commit without a spawn; want none", len(plan), err)
	}
}

// TestReadStepFile: a missing file is nothing; a link (to a device that
// never ends, here) and a file over the limit are errors naming the
// variable; a file within it is read whole.
func TestReadStepFile(t *testing.T) {
	dir := t.TempDir()
	if b, err := task.ReadStepFile(filepath.Join(dir, "none"), "DROVER_WAIT_FILE", 1024); b != nil || err != nil {
		t.Fatalf("missing file: %q, %v", b, err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	if _, err := task.ReadStepFile(link, "DROVER_WAIT_FILE", 1024); err == nil || !strings.Contains(err.Error(), "DROVER_WAIT_FILE must be a regular file") {
		t.Fatalf("link: %v", err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 1025), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := task.ReadStepFile(big, "DROVER_SLEEP_FILE", 1024); err == nil || !strings.Contains(err.Error(), "at most 1024 bytes") {
		t.Fatalf("big: %v", err)
	}
	if err := os.WriteFile(big, []byte("10m"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := task.ReadStepFile(big, "DROVER_SLEEP_FILE", 1024); string(b) != "10m" || err != nil {
		t.Fatalf("small: %q, %v", b, err)
	}
}

// TestInheritedEnvDropsTraceContext: the trace context a worker inherited
// (TRACEPARENT, TRACESTATE, BAGGAGE) does not reach a task's command; an
// OTEL_ setting, which says how to trace rather than which trace, does.
func TestInheritedEnvDropsTraceContext(t *testing.T) {
	in := []string{"PATH=/bin", "TRACEPARENT=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "TRACESTATE=k=v",
		"BAGGAGE=user=1", "OTEL_SERVICE_NAME=w", "TRACEPARENTS=x"}
	got := strings.Join(task.InheritedEnv(in), " ")
	if want := "PATH=/bin OTEL_SERVICE_NAME=w TRACEPARENTS=x"; got != want {
		t.Fatalf("inherited %q; want %q", got, want)
	}
}
