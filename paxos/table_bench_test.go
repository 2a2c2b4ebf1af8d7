package paxos

import (
	"fmt"
	"runtime"
	"testing"
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
