package task_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/task"
)

var fullStore = &drover.StoreFullError{Usage: 47 << 20, Quota: 64 << 20, HighWater: 0.7, LowWater: 0.6}

func checkStoreFull(t *testing.T, what string, err error) {
	t.Helper()
	var sf *drover.StoreFullError
	if !errors.Is(err, drover.ErrStoreFull) || !errors.As(err, &sf) {
		t.Fatalf("%s while the store is full: %v, want a *drover.StoreFullError", what, err)
	}
	if errors.Is(err, task.ErrConflict) || errors.Is(err, lock.ErrFenced) {
		t.Fatalf("%s while the store is full: %v also matches ErrConflict or ErrFenced", what, err)
	}
	for _, want := range []string{"47.0 MiB", "64.0 MiB", "drover tasks purge", "--quota-backend-bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %q does not say %q", what, err, want)
		}
	}
}

// TestRunnerCheckpointRefusedWhileStoreFull: the store fills (the guard key
// is set) while step 2 of 3 runs. Its checkpoint is refused with an error
// matching drover.ErrStoreFull that names usage and quota, the run stops,
// and nothing changed: the checkpoint is still step 1's, step 2 has no
// record, and the task lock is released. A run while the key exists runs
// step 2 again and is refused again. Once the key is gone a run resumes at
// step 2 and completes; step 1 never ran twice.
func TestRunnerCheckpointRefusedWhileStoreFull(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	keys := keyspace.MustNew(ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var runs [3]atomic.Int32
	var steps []task.Step
	for i, name := range []string{"ingest", "analyze", "report"} {
		steps = append(steps, task.Step{Name: name, Run: func(ctx context.Context, state []byte) ([]byte, error) {
			if runs[i].Add(1) == 1 && i == 1 { // the store fills while step 2 runs
				if err := storeguard.Set(ctx, cli, fullStore, keys); err != nil {
					return nil, err
				}
			}
			return append(append([]byte{}, state...), "|"+name...), nil
		}})
	}
	r := newRunner(t, ns, "worker-1", 5*time.Second, nil)
	store := r.Store()
	const id = "report-1"

	for attempt := 1; attempt <= 2; attempt++ {
		res, err := r.Run(ctx, id, steps)
		checkStoreFull(t, "Run", err)
		if !strings.Contains(err.Error(), "checkpoint step 2") {
			t.Fatalf("run %d: %q does not name the step", attempt, err)
		}
		wantRun := 1
		if attempt == 2 {
			wantRun = 0
		}
		if res.StepsRun != wantRun || res.ResumedFrom != attempt {
			t.Fatalf("run %d refused: %+v, want %d steps run, resumed from %d", attempt, res, wantRun, attempt)
		}
		cp, err := store.Load(ctx, id)
		if err != nil || cp.Step != 1 || cp.Completed || string(cp.State) != "|ingest" || cp.StepName != "ingest" {
			t.Fatalf("run %d: checkpoint after a refused commit: %+v, %v; want step 1's", attempt, cp, err)
		}
		hist, err := store.History(ctx, id)
		if err != nil || len(hist) != 1 || hist[0].Step != 1 {
			t.Fatalf("run %d: history after a refused commit: %+v, %v; want step 1 alone", attempt, hist, err)
		}
		if runs[1].Load() != int32(attempt) {
			t.Fatalf("run %d: step 2 ran %d times", attempt, runs[1].Load())
		}
	}

	// The lock was released: another worker takes it at once.
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	l, err := locker.TryAcquire(ctx, keyspace.TaskLock(id))
	if err != nil {
		t.Fatalf("task lock after a refused checkpoint: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	if err := storeguard.Clear(ctx, cli, keys); err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(ctx, id, steps)
	if err != nil || res.ResumedFrom != 2 || res.StepsRun != 2 || string(res.State) != "|ingest|analyze|report" {
		t.Fatalf("run once the store has room: %+v, %v; want to resume at step 2 and complete", res, err)
	}
	cp, err := store.Load(ctx, id)
	if err != nil || !cp.Completed || cp.Step != 3 {
		t.Fatalf("checkpoint after completion: %+v, %v", cp, err)
	}
	hist, err := store.History(ctx, id)
	if err != nil || len(hist) != 3 {
		t.Fatalf("history after completion: %+v, %v", hist, err)
	}
	if got := [3]int32{runs[0].Load(), runs[1].Load(), runs[2].Load()}; got != [3]int32{1, 3, 1} {
		t.Fatalf("steps ran %v times, want [1 3 1]", got)
	}
}

// TestCommitFencedAndGuarded: Commit's compares keep their meaning with the
// store-full guard added. While the guard key exists a commit under a held
// fence is refused with drover.ErrStoreFull and writes nothing; once it is
// gone the same commit succeeds; a commit from a stale checkpoint is still
// ErrConflict (not ErrStoreFull) when the store has room; and a commit
// under a fence that no longer holds is lock.ErrFenced whether or not the
// store is full: the fence is checked first.
func TestCommitFencedAndGuarded(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	keys := keyspace.MustNew(ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	const id = "fenced-1"
	l, err := locker.AcquireFenced(ctx, keyspace.TaskLock(id))
	if err != nil {
		t.Fatal(err)
	}
	step := func(n int) (task.Checkpoint, task.StepRecord) {
		now := time.Now().UTC()
		return task.Checkpoint{TaskID: id, Step: n, StepName: "s", Steps: 3, State: []byte{byte('0' + n)}, Worker: "w", Token: l.Token(), At: now},
			task.StepRecord{Step: n, Name: "s", Worker: "w", Token: l.Token(), StartedAt: now, FinishedAt: now}
	}
	prev, err := store.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	if err := storeguard.Set(ctx, cli, fullStore, keys); err != nil {
		t.Fatal(err)
	}
	next, rec := step(1)
	checkStoreFull(t, "Commit of step 1", store.Commit(ctx, l, prev, &next, rec))
	if cp, err := store.Load(ctx, id); err != nil || cp.Step != 0 {
		t.Fatalf("checkpoint after a refused commit: %+v, %v", cp, err)
	}
	if hist, err := store.History(ctx, id); err != nil || len(hist) != 0 {
		t.Fatalf("history after a refused commit: %+v, %v", hist, err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the lock counts as lost after a refusal for a full store: %v", err)
	}

	if err := storeguard.Clear(ctx, cli, keys); err != nil {
		t.Fatal(err)
	}
	next, rec = step(1)
	if err := store.Commit(ctx, l, prev, &next, rec); err != nil {
		t.Fatalf("Commit of step 1 once the store has room: %v", err)
	}
	// prev is stale now: a conflict, as before the guard.
	again, rec2 := step(2)
	if err := store.Commit(ctx, l, prev, &again, rec2); !errors.Is(err, task.ErrConflict) || errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("Commit from a stale checkpoint: %v, want task.ErrConflict", err)
	}

	// The lock's key goes behind the holder's back (it does not know: no
	// watch was started); the store is full too. The fence decides.
	if err := storeguard.Set(ctx, cli, fullStore, keys); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, l.Key()); err != nil {
		t.Fatal(err)
	}
	step2, rec2 := step(2)
	err = store.Commit(ctx, l, next, &step2, rec2)
	if !errors.Is(err, lock.ErrFenced) || errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("Commit under a lost lock on a full store: %v, want lock.ErrFenced", err)
	}
	if cp, err := store.Load(ctx, id); err != nil || cp.Step != 1 {
		t.Fatalf("checkpoint after a fenced-out commit: %+v, %v", cp, err)
	}
	if err := storeguard.Clear(ctx, cli, keys); err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(ctx, l, next, &step2, rec2); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("Commit under a lost lock once the store has room: %v, want lock.ErrFenced", err)
	}
}
