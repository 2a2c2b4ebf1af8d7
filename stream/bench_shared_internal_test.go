package stream

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestSharedKeyCost measures the hot path of a design not built: each
// batch writes one key per part of 100 streams, holding the part's
// streams' new events, fenced by their claims' compares alone, and a hub
// watches those keys' prefix and decodes every stream's events. (Not one
// key for all: etcd takes 128 compares and operations along any path of
// nested levels by default, so no put can be under a thousand compares.) With DROVER_BENCH_SHARED=N (streams; DROVER_BENCH_SHARED_ROUNDS
// batches, default 200) it logs the process's CPU per stream and batch,
// to set beside TestChunkCost's CPU per chunk.
func TestSharedKeyCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_SHARED"))
	if n <= 0 {
		t.Skip("set DROVER_BENCH_SHARED=1000 to measure")
	}
	rounds := 200
	if v, err := strconv.Atoi(os.Getenv("DROVER_BENCH_SHARED_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	es, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Stop()
	wcli, fcli := es.Client(t), es.Client(t)
	ctx := context.Background()
	l, err := wcli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	cmps := make([]clientv3.Cmp, n)
	for i := range n {
		key := "bench/claims/task-" + strconv.Itoa(i)
		r, err := wcli.Put(ctx, key, "", clientv3.WithLease(l.ID))
		if err != nil {
			t.Fatal(err)
		}
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(key), "=", r.Header.Revision)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	wch := fcli.Watch(wctx, "bench/stream-tail/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch
	got := make(chan int)
	go func() { // the hub: every stream's part decoded
		events := 0
		for resp := range wch {
			for _, ev := range resp.Events {
				var parts []json.RawMessage
				if err := json.Unmarshal(ev.Kv.Value, &parts); err != nil {
					t.Error(err)
					got <- -1
					return
				}
				for _, p := range parts {
					c, ok := decodeFast(p)
					if !ok {
						t.Errorf("a part is unreadable: %.200s", p)
						got <- -1
						return
					}
					events += len(c.List)
				}
				if string(ev.Kv.Key) == "bench/stream-tail/"+strconv.Itoa(rounds-1)+"-"+strconv.Itoa((n-1)/100*100) {
					got <- events
					return
				}
			}
		}
	}()
	cpu0, began := sharedCPU(), time.Now()
	for round := range rounds {
		var ops []clientv3.Op
		for p := 0; p < n; p += 100 {
			var parts []json.RawMessage
			for i := p; i < min(n, p+100); i++ {
				c := chunk{Attempt: 1, Token: int64(i), Events: int64(round), List: []Event{{Seq: int64(round + 2), Type: "token", Data: json.RawMessage(`{"text":"token"}`), Time: time.Now()}}}
				parts = append(parts, c.encode())
			}
			v, _ := json.Marshal(parts)
			key := "bench/stream-tail/" + strconv.Itoa(round) + "-" + strconv.Itoa(p)
			ops = append(ops, clientv3.OpTxn(cmps[p:min(n, p+100)], []clientv3.Op{clientv3.OpPut(key, string(v))}, nil))
		}
		resp, err := wcli.Txn(ctx).Then(ops...).Commit()
		if err != nil || !resp.Responses[len(ops)-1].GetResponseTxn().Succeeded {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	events := <-got
	if events < 0 {
		t.FailNow()
	}
	cpu, took := sharedCPU()-cpu0, time.Since(began)
	t.Logf("%d streams x %d batches of a key per 100 streams (an event a stream), %d events followed, %s: CPU %.1f µs a stream's write, %.2f ms a batch (%.2f cores)",
		n, rounds, events, took.Round(time.Millisecond), float64(cpu.Microseconds())/float64(n*rounds), float64(cpu.Microseconds())/1000/float64(rounds), cpu.Seconds()/took.Seconds())
}

func sharedCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
