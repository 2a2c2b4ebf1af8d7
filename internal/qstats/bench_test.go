package qstats

import (
	"testing"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkTake is the server's cost of counting one claim batch's keys:
// a run of 100 tasks, then their outcome batch, as a watch delivers them.
func BenchmarkTake(b *testing.B) {
	keys := keyspace.MustNew("bench")
	r, err := NewRecorder(Config{Client: &clientv3.Client{}, Namespace: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	seg := keyspace.SegmentName(990, time.Unix(1795867200, 0), "abc")
	slots := make([]int, 100)
	attempts := make([]int, 100)
	for i := range slots {
		slots[i], attempts[i] = i, 1
	}
	run := taskstore.Run{Worker: "w", ClaimedAt: time.Unix(1795867201, 0), Slots: slots, Attempts: attempts}.Encode()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		rev := int64(2*i + 10)
		wr := clientv3.WatchResponse{Events: []*clientv3.Event{
			{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(keys.Run("emails", seg, keyspace.RunName(100, "r", int64(i)))), Value: run, ModRevision: rev, Version: 1}},
			{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(keys.Out("emails", seg, keyspace.OutName(rev, 100, 0, 1))), ModRevision: rev + 1, Version: 1}},
		}}
		r.take(wr)
		if len(r.deltas) > 10000 {
			r.deltas = r.deltas[:0]
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100, "ns/task")
}
