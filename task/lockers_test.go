package task_test

// The runner with RunnerConfig.Locker of another backend than etcd: a real
// Redis and a real three-node Paxos group, worker processes that are
// SIGKILLed and SIGSTOPped, and the checkpoints fenced by the lock's token
// in etcd.

import (
	"github.com/droverhq/drover/lock/paxoslock"
	"github.com/droverhq/drover/paxos/client"

	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/paxostest"
	"github.com/droverhq/drover/internal/testenv/servicetest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lease/fencetest"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/task"
	"github.com/redis/go-redis/v9"
)

// lockerBackend is a lock backend other than etcd, started for one test.
type lockerBackend struct {
	name string
	url  string // as lockerFor and --lock-backend take it
	// takeAway frees lock name of namespace ns behind its holder's back,
	// as the backend does when the holder's TTL runs out.
	takeAway func(t *testing.T, ns, name string, holder lock.Locker, token int64)
}

// lockerBackends starts a Redis and a Paxos group for the test.
func lockerBackends(t *testing.T) []lockerBackend {
	t.Helper()
	addr := servicetest.Redis(t)
	g := paxostest.Start(t, 3)
	return []lockerBackend{
		{"redis", "redis://" + addr + "/0", func(t *testing.T, ns, name string, _ lock.Locker, _ int64) {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			defer rdb.Close()
			// The holder key of redislock.Locker (see lock/redis.go).
			if err := rdb.Del(context.Background(), "drover:{"+ns+":"+name+"}:holder").Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{"paxos", g.URL(), func(t *testing.T, ns, name string, holder lock.Locker, token int64) {
			c, err := client.New(client.Config{Endpoints: g.Endpoints})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close(context.Background()) }()
			// paxoslock.Locker keeps names of namespace NS as NS:NAME.
			if err := c.Release(context.Background(), ns+":"+name, holder.(*paxoslock.Locker).Owner(), uint64(token)); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

// newLocker opens a locker of b, closed when the test ends.
func (b lockerBackend) newLocker(t *testing.T, ns, id string, ttl time.Duration) lock.Locker {
	t.Helper()
	l, done, err := lockerFor(b.url, ns, ttl, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(done)
	return l
}

// newRunner makes a runner whose tasks are held through a locker of b.
func (b lockerBackend) newRunner(t *testing.T, ns, worker string, ttl time.Duration, onEvent func(task.Event)) (*task.Runner, lock.Locker) {
	t.Helper()
	locker := b.newLocker(t, ns, worker, ttl)
	r, err := task.NewRunner(context.Background(), srv.Client(t), task.RunnerConfig{Namespace: ns, WorkerID: worker, Locker: locker, OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r, locker
}

// TestLockerClaimIsAFence runs the fence conformance suite against a task
// held through each backend's lock: mutual exclusion, increasing tokens, a
// stale write refused, loss cancelling the context.
func TestLockerClaimIsAFence(t *testing.T) {
	for _, b := range lockerBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			store, _ := task.NewStore(srv.Client(t), ns)
			type held struct {
				locker lock.Locker
				id     string
			}
			var mu sync.Mutex
			holders := map[lease.Fence]held{}
			fencetest.Exercise(t, fencetest.Harness{
				Client: srv.Client(t),
				Key:    "/" + ns + "/fenced",
				Claim: func(ctx context.Context, id string) (lease.Fence, func(), error) {
					locker, done, err := lockerFor(b.url, ns, time.Second, "claimer")
					if err != nil {
						return nil, nil, err
					}
					f, release, err := store.ClaimLock(ctx, locker, id)
					if err != nil {
						done()
						return nil, nil, err
					}
					mu.Lock()
					holders[f] = held{locker, id}
					mu.Unlock()
					return f, func() { _ = release(context.Background()); done() }, nil
				},
				Lose: func(ctx context.Context, f lease.Fence) error {
					mu.Lock()
					h := holders[f]
					mu.Unlock()
					b.takeAway(t, ns, keyspace.TaskLock(h.id), h.locker, f.Token())
					return nil
				},
			})
		})
	}
}

// TestLockerTwoProcessesOneRunnerPerTask: two worker processes race
// through the same eight tasks; every step runs exactly once, on the worker
// its record names.
func TestLockerTwoProcessesOneRunnerPerTask(t *testing.T) {
	for _, b := range lockerBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			logPath := filepath.Join(t.TempDir(), "steps.log")
			var ids []string
			for i := range 8 {
				ids = append(ids, fmt.Sprintf("task-%02d", i))
			}
			var workers []*worker
			for w := range 2 {
				order := append(append([]string{}, ids[w*4:]...), ids[:w*4]...)
				workers = append(workers, startWorker(t, "run", "H_LOCKER="+b.url, "H_NS="+ns, "H_TTL=5s", "H_STEP=20ms", "H_STEPS=3",
					"H_LOG="+logPath, fmt.Sprintf("H_ID=worker-%d", w), "H_TASKS="+strings.Join(order, ",")))
			}
			for _, w := range workers {
				if err := w.cmd.Wait(); err != nil {
					t.Fatalf("worker: %v", err)
				}
			}
			store, _ := task.NewStore(srv.Client(t), ns)
			started := starts(t, logPath)
			ran := map[string]int{}
			for _, id := range ids {
				cp, err := store.Load(context.Background(), id)
				if err != nil || !cp.Completed || string(cp.State) != "|s1|s2|s3" {
					t.Fatalf("%s checkpoint = %+v (%v)", id, cp, err)
				}
				hist, err := store.History(context.Background(), id)
				if err != nil || len(hist) != 3 {
					t.Fatalf("%s history = %+v (%v)", id, hist, err)
				}
				for i, rec := range hist {
					key := fmt.Sprintf("%s s%d", id, i+1)
					if len(started[key]) != 1 || started[key][0] != rec.Worker {
						t.Fatalf("%s started by %v, want once, by %s as its record says", key, started[key], rec.Worker)
					}
					ran[rec.Worker]++
				}
			}
			t.Logf("steps run per worker: %v", ran)
		})
	}
}

// TestLockerWorkerKilledMidStep: the holder is SIGKILLed in step 2; a
// runner on the same backend takes over once the lock's TTL ends and
// resumes at step 2; only that step runs twice.
func TestLockerWorkerKilledMidStep(t *testing.T) {
	for _, b := range lockerBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			const ttl = 2 * time.Second
			logPath := filepath.Join(t.TempDir(), "steps.log")
			w := startWorker(t, "run", "H_LOCKER="+b.url, "H_NS="+ns, "H_TTL="+ttl.String(), "H_STEP=1s", "H_STEPS=4",
				"H_LOG="+logPath, "H_ID=victim", "H_TASKS=report")
			w.await(t, 20*time.Second, `"type":"step_started"`, `"step":2`)
			time.Sleep(300 * time.Millisecond) // mid-step
			if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			var resumedAfter time.Duration
			r, _ := b.newRunner(t, ns, "rescuer", 5*time.Second, func(ev task.Event) {
				if ev.Type == task.EventStepStarted && resumedAfter == 0 {
					resumedAfter = time.Since(killed)
				}
			})
			ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), taskIDKey{}, "report"), 20*time.Second)
			defer cancel()
			res, err := r.Run(ctx, "report", agentSteps(4, 10*time.Millisecond, logPath, "rescuer", false))
			if err != nil {
				t.Fatal(err)
			}
			if res.ResumedFrom != 2 || res.StepsRun != 3 || string(res.State) != "|s1|s2|s3|s4" {
				t.Fatalf("result = %+v, want a resume at step 2", res)
			}
			if resumedAfter > ttl+time.Second {
				t.Fatalf("resumed %s after SIGKILL, want within TTL + 1s", resumedAfter)
			}
			got := starts(t, logPath)
			want := map[string]string{"report s1": "victim", "report s2": "victim,rescuer", "report s3": "rescuer", "report s4": "rescuer"}
			for k, v := range want {
				if strings.Join(got[k], ",") != v {
					t.Fatalf("%s started by %v, want %s", k, got[k], v)
				}
			}
			hist, _ := r.Store().History(context.Background(), "report")
			if len(hist) != 4 || hist[0].Worker != "victim" || hist[1].Worker != "rescuer" || hist[1].Token <= hist[0].Token {
				t.Fatalf("history = %+v", hist)
			}
		})
	}
}

// TestLockerWorkerPausedPastTTL: the holder is SIGSTOPped in step 1, its
// lock expires, a successor runs the whole task; once continued, the paused
// worker's step context is cancelled and its late checkpoint refused.
func TestLockerWorkerPausedPastTTL(t *testing.T) {
	for _, b := range lockerBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			const ttl = 2 * time.Second
			w := startWorker(t, "report", "H_LOCKER="+b.url, "H_NS="+ns, "H_TTL="+ttl.String(), "H_STEP=2500ms", "H_STEPS=3",
				"H_ID=sleeper", "H_TASKS=report")
			w.await(t, 20*time.Second, `"type":"step_started"`, `"step":1`)
			time.Sleep(200 * time.Millisecond)
			if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			r, _ := b.newRunner(t, ns, "successor", 5*time.Second, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := r.Run(ctx, "report", agentSteps(3, 10*time.Millisecond, "", "successor", false))
			if cerr := w.cmd.Process.Signal(syscall.SIGCONT); err != nil || cerr != nil {
				t.Fatal(err, cerr)
			}
			if res.ResumedFrom != 1 || string(res.State) != "|s1|s2|s3" {
				t.Fatalf("successor result = %+v", res)
			}
			if line := w.await(t, 20*time.Second, "STEPCTX s1"); !strings.Contains(line, "cancelled=true") {
				t.Fatalf("the paused worker's step context was not cancelled: %s", line)
			}
			if line := w.await(t, 20*time.Second, "RESULT report"); !strings.Contains(line, "fenced=true") {
				t.Fatalf("the paused worker's checkpoint was not refused: %s", line)
			}
			cp, _ := r.Store().Load(context.Background(), "report")
			hist, _ := r.Store().History(context.Background(), "report")
			if !cp.Completed || string(cp.State) != "|s1|s2|s3" || cp.Worker != "successor" || len(hist) != 3 {
				t.Fatalf("the successor's progress was disturbed: %+v %+v", cp, hist)
			}
			for _, rec := range hist {
				if rec.Worker != "successor" || rec.Token != res.Token {
					t.Fatalf("step record %+v not written by the successor with token %d", rec, res.Token)
				}
			}
		})
	}
}

// TestLockerStaleHolderRefusedByEtcd: the holder's lock is taken away
// while its step runs and before its own watchdog could notice; a
// successor takes the task. The stale holder's checkpoint is refused by
// etcd (its token is below the one the successor raised the fence to), not
// by a local check, and its run stops there.
func TestLockerStaleHolderRefusedByEtcd(t *testing.T) {
	for _, b := range lockerBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			var token int64
			var lost []task.Event
			// A long TTL: the stale holder's watchdog does not run before
			// its write.
			stale, staleLocker := b.newRunner(t, ns, "stale", 30*time.Second, func(ev task.Event) {
				switch ev.Type {
				case task.EventAcquired:
					token = ev.Token
				case task.EventLost:
					lost = append(lost, ev)
				}
			})
			inStep, finish := make(chan struct{}), make(chan struct{})
			steps := []task.Step{{Name: "llm", Run: func(ctx context.Context, s []byte) ([]byte, error) {
				close(inStep)
				<-finish // a call that ignores its context
				return []byte("stale"), nil
			}}, {Name: "report", Run: func(ctx context.Context, s []byte) ([]byte, error) { return append(s, "|report"...), nil }}}
			done := make(chan error, 1)
			go func() { _, err := stale.Run(context.Background(), "job", steps); done <- err }()
			<-inStep
			b.takeAway(t, ns, keyspace.TaskLock("job"), staleLocker, token)
			succ, _ := b.newRunner(t, ns, "successor", 30*time.Second, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			fresh := []task.Step{{Name: "llm", Run: func(ctx context.Context, s []byte) ([]byte, error) { return []byte("fresh"), nil }}, steps[1]}
			res, err := succ.Run(ctx, "job", fresh)
			close(finish)
			if err != nil || string(res.State) != "fresh|report" || res.Token <= token {
				t.Fatalf("successor: %+v, %v", res, err)
			}
			err = <-done
			if !errors.Is(err, lock.ErrFenced) || !strings.Contains(err.Error(), "has written since") {
				t.Fatalf("stale holder's checkpoint: %v, want refused by etcd with lock.ErrFenced", err)
			}
			if len(lost) != 1 || lost[0].Step != 1 {
				t.Fatalf("stale holder's events: %+v, want one EventLost at step 1", lost)
			}
			cp, _ := succ.Store().Load(context.Background(), "job")
			if !cp.Completed || string(cp.State) != "fresh|report" || cp.Worker != "successor" {
				t.Fatalf("checkpoint %+v, want the successor's", cp)
			}
		})
	}
}

// TestLockerNewHolderCutsOffOldBeforeWriting: a new holder raises the
// task's fence as soon as it holds the lock, so the old holder's write is
// refused even though the new one has written nothing yet, and the new
// holder's first checkpoint is not disturbed by it.
func TestLockerNewHolderCutsOffOldBeforeWriting(t *testing.T) {
	for _, b := range lockerBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			ctx := context.Background()
			store, _ := task.NewStore(srv.Client(t), ns)
			oldLocker := b.newLocker(t, ns, "old", 30*time.Second)
			old, releaseOld, err := store.ClaimLock(ctx, oldLocker, "job")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = releaseOld(ctx) }()
			b.takeAway(t, ns, keyspace.TaskLock("job"), oldLocker, old.Token())
			cur, releaseCur, err := store.ClaimLock(ctx, b.newLocker(t, ns, "new", 30*time.Second), "job")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = releaseCur(ctx) }()
			commit := func(f lease.Fence, worker string) error {
				cp, err := store.Load(ctx, "job")
				if err != nil {
					t.Fatal(err)
				}
				next := task.Checkpoint{TaskID: "job", Step: 1, StepName: "s1", Steps: 2, State: []byte(worker), Worker: worker, Token: f.Token(), At: time.Now()}
				return store.Commit(ctx, f, cp, &next, task.StepRecord{Step: 1, Name: "s1", Worker: worker, Token: f.Token()})
			}
			if err := commit(old, "old"); !errors.Is(err, lock.ErrFenced) || old.Err() == nil || old.Context().Err() == nil {
				t.Fatalf("old holder's write: %v (Err %v), want lock.ErrFenced and its context ended", err, old.Err())
			}
			if err := commit(cur, "new"); err != nil {
				t.Fatalf("new holder's first write: %v", err)
			}
			if cp, _ := store.Load(ctx, "job"); cp.Worker != "new" || cp.Token != cur.Token() {
				t.Fatalf("checkpoint %+v, want the new holder's", cp)
			}
		})
	}
}
