package paxos

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// benchTable is a table that remembers n acquisitions, as a busy group's
// does: 64 locks, 20-byte ids.
func benchTable(n int) *Table {
	tb := NewTable(0)
	for i := 1; i <= n; i++ {
		tb.Apply(uint64(i), Command{Op: OpAcquire, ID: fmt.Sprintf("cmd-%016x", i), Lock: fmt.Sprintf("lock-%d", i%64),
			Owner: "owner-1234", Time: 1_000_000, TTL: 50})
	}
	return tb
}

// BenchmarkTableMemory measures what the table's memory of results costs
// the process beside the snapshots (BenchmarkTableSnapshot): the live
// heap per remembered result, and the time of a full garbage collection
// with the table alive (ns/op), which is mostly marking what the heap
// holds. 840,000 results are a busy group's five-minute window.
//
//	go test ./paxos -run '^$' -bench BenchmarkTableMemory -benchtime 20x
func BenchmarkTableMemory(b *testing.B) {
	const n = 840_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := benchTable(n)
	runtime.GC()
	runtime.ReadMemStats(&after)
	for b.Loop() {
		runtime.GC()
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-bytes/result")
	runtime.KeepAlive(tb)
}

func BenchmarkTableApply(b *testing.B) {
	tb := NewTable(time.Second)
	var slot uint64
	now := int64(1_000_000)
	b.ReportAllocs()
	for b.Loop() {
		slot++
		now++
		lock := fmt.Sprintf("lock-%d", slot%1024)
		r := tb.Apply(slot, Command{Op: OpAcquire, ID: fmt.Sprintf("a%d", slot), Lock: lock, Owner: "o", Time: now, TTL: 50})
		if r.Code == CodeOK {
			slot++
			tb.Apply(slot, Command{Op: OpRelease, ID: fmt.Sprintf("r%d", slot), Lock: lock, Owner: "o", Token: r.Lock.Token, Time: now})
		}
	}
}

// BenchmarkTableSnapshot encodes a table holding n remembered results
// (840,000 is five minutes of 2,800 writes a second) and reports the
// snapshot's size.
//
//	go test ./paxos -run '^$' -bench BenchmarkTableSnapshot -benchtime 5x
func BenchmarkTableSnapshot(b *testing.B) {
	for _, n := range []int{20_000, 840_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			tb := benchTable(n)
			var size int
			for b.Loop() {
				data, err := tb.Snapshot()
				if err != nil {
					b.Fatal(err)
				}
				size = len(data)
			}
			b.ReportMetric(float64(size), "bytes")
		})
	}
}
