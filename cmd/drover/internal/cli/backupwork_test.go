package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// backupNS is the namespace of the work that TestBackupRestore keeps going
// while it backs up.
const backupNS = "backup-work"

// ackedWork is what a workWriter had acknowledged, each with a revision
// read after its acknowledgement (so at or above the revision it was
// written at): a conservative bound, since work whose bound is at or below
// a backup's revision was written at or below it too.
type ackedWork struct {
	tasks map[string]int64  // task id -> revision bound
	cps   map[string]cpSeen // checkpoint id -> its thread, state and revision bound
}

// cpSeen is one checkpoint written.
type cpSeen struct {
	thread string
	state  []byte
	rev    int64
}

// workWriter submits a task, claims it, acks it, and writes a checkpoint
// of a thread, over and over, until halted.
type workWriter struct {
	mu   sync.Mutex
	work ackedWork
	stop chan struct{}
	done chan struct{}
	errs []error
}

// startWorkWriter starts a workWriter on cli.
func startWorkWriter(t *testing.T, cli *clientv3.Client) *workWriter {
	t.Helper()
	q, err := queue.NewClient(cli, backupNS)
	if err != nil {
		t.Fatal(err)
	}
	cps, err := checkpoint.NewEtcd(cli, backupNS)
	if err != nil {
		t.Fatal(err)
	}
	l, err := lease.Grant(context.Background(), cli, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := &workWriter{work: ackedWork{tasks: map[string]int64{}, cps: map[string]cpSeen{}}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer l.Close(context.Background())
		heads := map[string]string{}
		for i := 0; i < maxWrites; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			w.step(ctx, cli, q, cps, l, heads, i)
			cancel()
		}
	}()
	t.Cleanup(w.halt)
	return w
}

// step is one round: task i through its whole life, and a checkpoint of
// one of three threads.
func (w *workWriter) step(ctx context.Context, cli *clientv3.Client, q *queue.Client, cps *checkpoint.Etcd, l *lease.Lease, heads map[string]string, i int) {
	id := fmt.Sprintf("bk-%05d", i)
	if _, err := q.Submit(ctx, "backup", []queue.Task{{ID: id, Type: "noop"}}, nil); err != nil {
		w.fail(err)
		return
	}
	ts, err := q.Claim(ctx, "backup", queue.ClaimRequest{Lease: l, Worker: "backup-test", Max: 1})
	if err != nil || len(ts) != 1 {
		w.fail(fmt.Errorf("claim %s: %d tasks, %v", id, len(ts), err))
		return
	}
	if _, err := q.Ack(ctx, queue.Held{Queue: "backup", ID: ts[0].ID, Token: ts[0].Token, Lease: l.ID()}, []byte(fmt.Sprintf(`"r-%s"`, ts[0].ID))); err != nil {
		w.fail(err)
		return
	}
	rev := readRevision(ctx, cli)
	thread := fmt.Sprintf("thread-%d", i%3)
	state := []byte(fmt.Sprintf(`{"step":%d}`, i))
	cp, err := cps.Put(ctx, checkpoint.Checkpoint{ThreadID: thread, ParentID: heads[thread], State: state}, nil)
	if err != nil {
		w.fail(err)
		return
	}
	heads[thread] = cp.ID
	cpRev := readRevision(ctx, cli)
	w.mu.Lock()
	defer w.mu.Unlock()
	if rev > 0 {
		w.work.tasks[ts[0].ID] = rev
	}
	if cpRev > 0 {
		w.work.cps[cp.ID] = cpSeen{thread: thread, state: state, rev: cpRev}
	}
}

// readRevision is the store's revision now (0 when it cannot be read).
func readRevision(ctx context.Context, cli *clientv3.Client) int64 {
	g, err := cli.Get(ctx, "/"+backupNS+"/revision-probe")
	if err != nil {
		return 0
	}
	return g.Header.Revision
}

// fail records an error of the writer (shown if the test fails).
func (w *workWriter) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, err)
}

// counts returns how many tasks and checkpoints were acknowledged.
func (w *workWriter) counts() (tasks, cps int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.work.tasks), len(w.work.cps)
}

// halt stops the writer and waits for it.
func (w *workWriter) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// checkRestored checks that every task and checkpoint acknowledged at or
// below revision rev is on the restored store cli reaches: the task
// SUCCEEDED with its result, the checkpoint with its state.
func (w *workWriter) checkRestored(t *testing.T, cli *clientv3.Client, rev int64) {
	t.Helper()
	ctx := context.Background()
	q, err := queue.NewClient(cli, backupNS)
	if err != nil {
		t.Fatal(err)
	}
	cps, err := checkpoint.NewEtcd(cli, backupNS)
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	tasks, points := 0, 0
	for id, r := range w.work.tasks {
		if r > rev {
			continue
		}
		tasks++
		got, err := q.Get(ctx, id)
		if err != nil || got.CurrentStatus != queue.Succeeded || string(got.Result) != fmt.Sprintf(`"r-%s"`, id) {
			t.Fatalf("task %s, acknowledged by revision %d, after the restore of revision %d: %+v, %v", id, r, rev, got, err)
		}
	}
	for id, cp := range w.work.cps {
		if cp.rev > rev {
			continue
		}
		points++
		got, err := cps.Get(ctx, cp.thread, "", id)
		if err != nil || !bytes.Equal(got.State, cp.state) {
			t.Fatalf("checkpoint %s of %s, written by revision %d, after the restore of revision %d: %+v, %v", id, cp.thread, cp.rev, rev, got, err)
		}
	}
	t.Logf("restored: %d of %d tasks acknowledged and %d of %d checkpoints written before the backup's revision, all there (errors of the writer: %v)",
		tasks, len(w.work.tasks), points, len(w.work.cps), w.errs)
	if tasks == 0 || points == 0 {
		t.Fatalf("no task (%d) or no checkpoint (%d) was acknowledged before the backup: the check checked nothing", tasks, points)
	}
}
