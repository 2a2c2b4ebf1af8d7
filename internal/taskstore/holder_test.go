package taskstore

import (
	"context"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The runner's lock is the lock package's key of keyspace.TaskLock: the
// queue's compare and count read exactly its keys.
func TestRunnerLock(t *testing.T) {
	keys, err := keyspace.New("ns")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := RunnerLock(keys, "t-1"), keys.Lock(keyspace.TaskLock("t-1")); got != want {
		t.Fatalf("RunnerLock: %q, want %q", got, want)
	}
}

// A queue's hold on a task id: its claim key for a task with a record of
// its own, the run whose value names its slot for a task in a segment,
// nothing for an id that is not queued.
func TestQueueHold(t *testing.T) {
	_, cli := etcdtest.StartOwn(t)
	keys, err := keyspace.New(etcdtest.Namespace(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	put := func(k, v string) {
		t.Helper()
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	holder := func(id string) (string, bool) {
		t.Helper()
		h, ok, err := FindQueueHold(ctx, cli, keys, id)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return "", false
		}
		k, rev, err := h.Holder(ctx, cli)
		if err != nil || rev == 0 {
			t.Fatalf("holder of %s: rev %d, %v", id, rev, err)
		}
		return k, true
	}
	if _, ok := holder("none"); ok {
		t.Fatal("an id that is not queued has a hold")
	}

	// A task in slot 3 of a segment: held by the run that names slot 3.
	put(keys.TaskIndex("seg-task"), keyspace.TaskPlace{Queue: "q", Segment: "s1", Slot: 3}.String())
	if k, ok := holder("seg-task"); !ok || k != "" {
		t.Fatalf("a task in a segment with no run: holder %q (%v)", k, ok)
	}
	put(keys.Runs("q", "s1")+"2-other", string(Run{Worker: "w", Slots: []int{1, 2}, Attempts: []int{1, 1}}.Encode()))
	put(keys.Runs("q", "s1")+"x-broken", "\x7f")
	if k, _ := holder("seg-task"); k != "" {
		t.Fatalf("a run of other slots holds the task: %q", k)
	}
	mine := keys.Runs("q", "s1") + "2-mine"
	put(mine, string(Run{Worker: "w", Slots: []int{3, 4}, Attempts: []int{1, 2}}.Encode()))
	if k, _ := holder("seg-task"); k != mine {
		t.Fatalf("holder %q, want the run %q", k, mine)
	}

	// A task with a record of its own: held by its claim key.
	put(keys.TaskRecord("rec-task"), `{"queue":"q2"}`)
	if k, ok := holder("rec-task"); !ok || k != "" {
		t.Fatalf("an unclaimed task with a record: holder %q (%v)", k, ok)
	}
	claim := keys.QueueClaim("q2", "rec-task")
	put(claim, "{}")
	if k, _ := holder("rec-task"); k != claim {
		t.Fatalf("holder %q, want the claim %q", k, claim)
	}
	// A record that names no queue is not a queued task.
	put(keys.TaskRecord("odd"), `{"x":1}`)
	if _, ok := holder("odd"); ok {
		t.Fatal("a record without a queue has a hold")
	}
}

// The compare that the runner's lock is free holds until a key of the
// lock exists, and CountRunners counts its keys.
func TestNoRunner(t *testing.T) {
	_, cli := etcdtest.StartOwn(t)
	keys, err := keyspace.New(etcdtest.Namespace(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lock := RunnerLock(keys, "t")
	check := func(want bool, n int64) {
		t.Helper()
		r, err := cli.Txn(ctx).If(NoRunner(lock)).Then().Else(CountRunners(lock)).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if r.Succeeded != want {
			t.Fatalf("NoRunner: %v, want %v", r.Succeeded, want)
		}
		if !want && r.Responses[0].GetResponseRange().Count != n {
			t.Fatalf("CountRunners: %d, want %d", r.Responses[0].GetResponseRange().Count, n)
		}
	}
	check(true, 0)
	// Another id's lock, whose name starts with this one's, is not this
	// task's runner.
	if _, err := cli.Put(ctx, keys.LockContender(keyspace.TaskLock("t2"), "holder"), ""); err != nil {
		t.Fatal(err)
	}
	check(true, 0)
	if _, err := cli.Put(ctx, keys.LockContender(keyspace.TaskLock("t"), "holder"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, keys.LockContender(keyspace.TaskLock("t"), "waiter"), ""); err != nil {
		t.Fatal(err)
	}
	check(false, 2)
	if _, err := cli.Delete(ctx, lock, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	check(true, 0)
}
