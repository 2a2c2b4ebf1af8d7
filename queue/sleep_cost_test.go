package queue_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// countingKV counts the requests a client sends through its KV: each
// Get, Put, Delete, Do and committed Txn is one round trip.
type countingKV struct {
	clientv3.KV
	n *atomic.Int64
}

func (k countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.n.Add(1)
	return k.KV.Get(ctx, key, opts...)
}

func (k countingKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.n.Add(1)
	return k.KV.Put(ctx, key, val, opts...)
}

func (k countingKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	k.n.Add(1)
	return k.KV.Delete(ctx, key, opts...)
}

func (k countingKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	k.n.Add(1)
	return k.KV.Do(ctx, op)
}

func (k countingKV) Txn(ctx context.Context) clientv3.Txn { return countingTxn{k.KV.Txn(ctx), k.n} }

type countingTxn struct {
	clientv3.Txn
	n *atomic.Int64
}

func (t countingTxn) If(cs ...clientv3.Cmp) clientv3.Txn { return countingTxn{t.Txn.If(cs...), t.n} }
func (t countingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	return countingTxn{t.Txn.Then(ops...), t.n}
}
func (t countingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	return countingTxn{t.Txn.Else(ops...), t.n}
}
func (t countingTxn) Commit() (*clientv3.TxnResponse, error) {
	t.n.Add(1)
	return t.Txn.Commit()
}

// TestSleepRoundTrips counts the etcd requests a worker sends for a
// three-step task, without a sleep and with one after step 1 (parking,
// then the resume on the due index's move): the difference is what a
// sleep and its resume cost. The figures are in docs/architecture.md.
func TestSleepRoundTrips(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	cli := srv.Client(t)
	var n atomic.Int64
	cli.KV = countingKV{cli.KV, &n}
	var sc stepCounter
	steps := sc.steps(time.Second)
	plain := append([]task.Step{{Name: "s1", Run: func(_ context.Context, s []byte) ([]byte, error) { return s, nil }}}, steps[1:]...)
	store, _ := task.NewStore(cli, ns)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 1, DepthInterval: time.Hour,
		BackoffBase: time.Second, BackoffMax: time.Second})
	w.Handle("plain", queue.Steps(store, plain...))
	w.Handle("sleepy", queue.Steps(store, steps...))
	var failed atomic.Bool
	flaky := append([]task.Step{}, plain...)
	flaky[1] = task.Step{Name: "s2", Run: func(_ context.Context, s []byte) ([]byte, error) {
		if !failed.Swap(true) {
			return nil, errors.New("once")
		}
		return s, nil
	}}
	w.Handle("flaky", queue.Steps(store, flaky...))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = w.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	status := func(id string) queue.Status {
		got, err := c.Get(context.Background(), id)
		if err != nil {
			return ""
		}
		return got.CurrentStatus
	}
	settle := func() { time.Sleep(100 * time.Millisecond) } // let the worker's own reads after an outcome end
	measure := func(what string, do func(), until func() bool) int64 {
		settle()
		before := n.Load()
		do()
		waitUntil(t, what, until)
		settle()
		return n.Load() - before
	}
	submit := func(id, typ string) func() {
		return func() {
			if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: id, Type: typ}}, nil); err != nil {
				t.Error(err)
			}
		}
	}
	base := measure("the plain task", submit("p1", "plain"), func() bool { return status("p1") == queue.Succeeded })
	park := measure("the task to sleep", submit("z1", "sleepy"), func() bool { return status("z1") == queue.Sleeping })
	resume := measure("the task to resume and finish", func() {}, func() bool { return status("z1") == queue.Succeeded })
	retry := measure("the flaky task", submit("f1", "flaky"), func() bool { return status("f1") == queue.Succeeded })
	t.Logf("etcd requests of the worker: 3 steps without a sleep %d; with a sleep after step 1: to park %d, to resume and finish %d "+
		"(the sleep and its resume cost %d); with a retry of step 2 instead: %d (the retry cost %d)",
		base, park, resume, park+resume-base, retry, retry-base)
	if extra := park + resume - base; extra > 2*(retry-base)+10 {
		t.Fatalf("a sleep and its resume cost %d requests, a retry %d: want about the same", extra, retry-base)
	}
}
