package qstats

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// failKV fails the Txn commits for which fail says so, counted from 1.
type failKV struct {
	clientv3.KV
	n    atomic.Int64
	fail atomic.Pointer[func(n int64) bool]
}

func (f *failKV) Txn(ctx context.Context) clientv3.Txn {
	return &failTxn{Txn: f.KV.Txn(ctx), f: f}
}

type failTxn struct {
	clientv3.Txn
	f *failKV
}

func (t *failTxn) If(c ...clientv3.Cmp) clientv3.Txn  { t.Txn = t.Txn.If(c...); return t }
func (t *failTxn) Then(o ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(o...); return t }
func (t *failTxn) Else(o ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(o...); return t }
func (t *failTxn) Commit() (*clientv3.TxnResponse, error) {
	n := t.f.n.Add(1)
	if fail := t.f.fail.Load(); fail != nil && (*fail)(n) {
		return nil, errors.New("injected: etcd unavailable")
	}
	return t.Txn.Commit()
}

func startWith(t *testing.T, cfg Config) *Recorder {
	t.Helper()
	r, err := NewRecorder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.Start(context.Background())
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	<-r.Ready()
	return r
}

// manyQueues is more queues than one transaction's records.
const manyQueues = maxTxnOps + 30

// succeedOnce counts one success in each of manyQueues queues.
func succeedOnce(t *testing.T, cli *clientv3.Client, ns, id string) {
	t.Helper()
	keys := keyspace.MustNew(ns)
	for i := range manyQueues {
		if _, err := cli.Put(context.Background(), keys.QueueDoneKey(fmt.Sprintf("q%03d", i), "SUCCEEDED", time.Now(), id), ""); err != nil {
			t.Fatal(err)
		}
	}
}

// totals reads each of manyQueues queues' processed count through m.
func totals(t *testing.T, cli *clientv3.Client, ns string, m time.Time) []int64 {
	t.Helper()
	out := make([]int64, manyQueues)
	for i := range out {
		h, err := Read(context.Background(), cli, ns, fmt.Sprintf("q%03d", i), Hour, m)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = h.Total.Processed
	}
	return out
}

// A minute with more records than a transaction takes is claimed by its
// first transaction (the mark and the first records); a later one that
// fails is retried, and one that keeps failing loses its records: no
// event is ever counted in two minutes, and the next minute closes.
func TestCloseChunkFailureNeverDoubleCounts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fails int64 // the transactions that fail after the claim
		lost  bool
	}{{"retried", 1, false}, {"lost", 3, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			cli := srv.Client(t)
			fk := &failKV{KV: cli.KV}
			cli.KV = fk
			r := startWith(t, Config{Client: cli, Namespace: ns, Manual: true})
			put := srv.Client(t)
			succeedOnce(t, put, ns, "one")
			waitCounted(t, r, fmt.Sprintf("q%03d", manyQueues-1), Counts{Processed: 1})
			from := fk.n.Load() + 2
			fail := func(n int64) bool { return n >= from && n < from+tc.fails }
			fk.fail.Store(&fail)
			ok, err := r.CloseMinute(context.Background(), t0)
			if !ok || (err != nil) != tc.lost {
				t.Fatalf("close: %v %v", ok, err)
			}
			if ok, _ := r.CloseMinute(context.Background(), t0); ok {
				t.Fatal("the minute closed twice")
			}
			m1 := t0.Add(time.Minute)
			if ok, err := r.CloseMinute(context.Background(), m1); !ok || err != nil {
				t.Fatalf("next close: %v %v", ok, err)
			}
			got := totals(t, put, ns, m1)
			var lost int
			for i, n := range got {
				switch {
				case n == 0 && tc.lost && i >= maxTxnOps-1:
					lost++
				case n != 1:
					t.Errorf("q%03d: 1 task succeeded, history counts %d", i, n)
				}
			}
			if tc.lost && lost != manyQueues-(maxTxnOps-1) {
				t.Errorf("%d records lost, want the second transaction's %d", lost, manyQueues-(maxTxnOps-1))
			}
		})
	}
}

// hookKV calls before(n) before the n-th Txn commit.
type hookKV struct {
	clientv3.KV
	n      atomic.Int64
	before func(n int64)
}

func (f *hookKV) Txn(ctx context.Context) clientv3.Txn { return &hookTxn{Txn: f.KV.Txn(ctx), f: f} }

type hookTxn struct {
	clientv3.Txn
	f *hookKV
}

func (t *hookTxn) If(c ...clientv3.Cmp) clientv3.Txn  { t.Txn = t.Txn.If(c...); return t }
func (t *hookTxn) Then(o ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(o...); return t }
func (t *hookTxn) Else(o ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(o...); return t }
func (t *hookTxn) Commit() (*clientv3.TxnResponse, error) {
	t.f.before(t.f.n.Add(1))
	return t.Txn.Commit()
}

// Two servers close the same minute at once, each with more records than
// a transaction takes: the first to move the mark writes the minute; the
// other's records are never written (over the first's), and the events
// after the first's mark go to the next minute only.
func TestCloseConcurrentChunkedCloses(t *testing.T) {
	ns := etcdtest.Namespace(t)
	put := srv.Client(t)
	ca, cb := srv.Client(t), srv.Client(t)
	paused, resume := make(chan struct{}), make(chan struct{})
	ka := &hookKV{KV: ca.KV, before: func(n int64) {
		if n == 2 { // after A's claim, before its second transaction
			close(paused)
			<-resume
		}
	}}
	ca.KV = ka
	a := startWith(t, Config{Client: ca, Namespace: ns, Manual: true})
	b := startWith(t, Config{Client: cb, Namespace: ns, Manual: true,
		Depth: func() map[string]Depth { return map[string]Depth{"a-extra": {Pending: 1}} }})
	succeedOnce(t, put, ns, "one")
	last := fmt.Sprintf("q%03d", manyQueues-1)
	waitCounted(t, a, last, Counts{Processed: 1})
	waitCounted(t, b, last, Counts{Processed: 1})
	chA := make(chan bool, 1)
	go func() { ok, _ := a.CloseMinute(context.Background(), t0); chA <- ok }()
	<-paused
	succeedOnce(t, put, ns, "two")
	if !etcdtest.Eventually(30*time.Second, func() bool { return b.Unclosed(last) == Counts{Processed: 1} }) {
		t.Fatalf("B counted %+v after A's mark", b.Unclosed(last))
	}
	if ok, err := b.CloseMinute(context.Background(), t0); ok {
		t.Fatalf("B closed the minute A claimed: %v", err)
	}
	close(resume)
	if !<-chA {
		t.Fatal("A did not close")
	}
	waitCounted(t, a, last, Counts{Processed: 1})
	m1 := t0.Add(time.Minute)
	if ok, err := a.CloseMinute(context.Background(), m1); !ok || err != nil {
		t.Fatalf("close m1: %v %v", ok, err)
	}
	for i, n := range totals(t, put, ns, m1) {
		if n != 2 {
			t.Errorf("q%03d: 2 succeeded, history counts %d", i, n)
		}
	}
	h, err := Read(context.Background(), put, ns, "a-extra", Hour, m1)
	if err != nil || minuteOf(h, t0).Pending != 0 {
		t.Errorf("B's record of a-extra was written in A's minute: %+v %v", minuteOf(h, t0), err)
	}
}

// A mark deleted (by hand, or with the namespace's keys) does not stop
// the minutes from closing: the next close writes it again.
func TestCloseAfterMarkDeleted(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	r := startWith(t, Config{Client: cli, Namespace: ns, Manual: true})
	if ok, err := r.CloseMinute(context.Background(), t0); !ok || err != nil {
		t.Fatalf("close: %v %v", ok, err)
	}
	if _, err := cli.Delete(context.Background(), keyspace.MustNew(ns).QueueHistoryMark()); err != nil {
		t.Fatal(err)
	}
	// The watch does not carry the deletion: the close whose compare fails
	// finds the mark gone, and the next one writes it again.
	if !etcdtest.Eventually(30*time.Second, func() bool {
		ok, _ := r.CloseMinute(context.Background(), t0.Add(time.Minute))
		return ok
	}) {
		t.Fatal("no minute closes after the mark was deleted")
	}
}
