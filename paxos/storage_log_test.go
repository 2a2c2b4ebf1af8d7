package paxos

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkDurableAccept compares two layouts for an acceptor's durable
// write, three writers at once on one disk as the three nodes of the
// benchmarks run: Storage.Accept (a bbolt commit: the changed pages, an
// fdatasync, the meta page, another fdatasync), and a prototype of an
// append-only log (the batch's entries as length-prefixed JSON records, one
// write, one fdatasync; also into a file sized beforehand), which is what a
// write-ahead log in front of the store would cost per batch. One op is one batch of n entries on each
// writer; µs/commit is the mean time of one writer's durable write.
//
// The prototype is only what such a log writes per batch, not a store: it
// has no recovery, truncation or snapshots.
//
//	go test ./paxos -run '^$' -bench BenchmarkDurableAccept -benchtime 3s
func BenchmarkDurableAccept(b *testing.B) {
	const writers = 3
	for _, n := range []int{3, 20} {
		b.Run(fmt.Sprintf("bbolt/entries=%d", n), func(b *testing.B) {
			stores := make([]*Storage, writers)
			for i := range stores {
				s, _, err := OpenStorage(b.TempDir(), "g", NodeID(i), storTestPeers)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				stores[i] = s
			}
			ballot := Ballot{Round: 1, Node: 1}
			concurrentCommits(b, writers, func(w int, op uint64) error {
				return stores[w].Accept(ballot, storTestEntries(op*uint64(n)+1, (op+1)*uint64(n), ballot))
			})
		})
		for _, pre := range []bool{false, true} {
			name := "log"
			if pre {
				name = "log-preallocated"
			}
			b.Run(fmt.Sprintf("%s/entries=%d", name, n), func(b *testing.B) { benchLog(b, writers, n, pre) })
		}
	}
}

// benchLog appends batches of n entries to one log file per writer, each
// made durable with one fdatasync. preallocated: the file is sized
// beforehand with fallocate (as etcd's WAL preallocates its segments) and written in
// place, so that the fdatasync need not also commit the file's new size.
func benchLog(b *testing.B, writers, n int, preallocated bool) {
	files := make([]*os.File, writers)
	offsets := make([]int64, writers)
	for i := range files {
		f, err := os.OpenFile(filepath.Join(b.TempDir(), "log"), os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if preallocated {
			// Blocks allocated, not a sparse file: writing into a hole
			// would allocate, and journal, as appending does.
			if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(b.N)*int64(n)*512); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
		files[i] = f
	}
	ballot := Ballot{Round: 1, Node: 1}
	concurrentCommits(b, writers, func(w int, op uint64) error {
		var buf []byte
		for _, e := range storTestEntries(op*uint64(n)+1, (op+1)*uint64(n), ballot) {
			v, err := json.Marshal(e)
			if err != nil {
				return err
			}
			buf = binary.AppendUvarint(buf, uint64(len(v)))
			buf = append(buf, v...)
		}
		if _, err := files[w].WriteAt(buf, offsets[w]); err != nil {
			return err
		}
		offsets[w] += int64(len(buf))
		return files[w].Sync()
	})
}

// concurrentCommits runs b.N ops on each of writers goroutines at once and
// reports the mean time of one commit.
func concurrentCommits(b *testing.B, writers int, commit func(w int, op uint64) error) {
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	var busy time.Duration
	var mu sync.Mutex
	b.ResetTimer()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine time.Duration
			for op := uint64(0); op < uint64(b.N); op++ {
				t0 := time.Now()
				if err := commit(w, op); err != nil {
					errs <- err
					return
				}
				mine += time.Since(t0)
			}
			mu.Lock()
			busy += mine
			mu.Unlock()
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(busy.Microseconds())/float64(b.N*writers), "µs/commit")
}
