package paxos

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// BenchmarkDurableAccept compares two layouts for an acceptor's durable
// write, three writers at once on one disk as the three nodes of the
// benchmarks run: Storage.Accept (one record appended to the acceptor's
// log, one fsync), and the earlier layout, which kept the entries in bbolt
// (a commit: the changed B+tree pages, an fdatasync, the meta page,
// another fdatasync). One op is one batch of n entries on each writer;
// µs/commit is the mean time of one writer's durable write.
//
//	go test ./paxos -run '^$' -bench BenchmarkDurableAccept -benchtime 3s
func BenchmarkDurableAccept(b *testing.B) {
	const writers = 3
	ballot := Ballot{Round: 1, Node: 1}
	for _, n := range []int{3, 20} {
		b.Run(fmt.Sprintf("log/entries=%d", n), func(b *testing.B) {
			stores := make([]*Storage, writers)
			for i := range stores {
				s, _, err := OpenStorage(b.TempDir(), "g", NodeID(i), storTestPeers)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				stores[i] = s
			}
			concurrentCommits(b, writers, func(w int, op uint64) error {
				return stores[w].Accept(ballot, storTestEntries(op*uint64(n)+1, (op+1)*uint64(n), ballot))
			})
		})
		b.Run(fmt.Sprintf("bbolt/entries=%d", n), func(b *testing.B) {
			dbs := make([]*bolt.DB, writers)
			for i := range dbs {
				db, err := bolt.Open(filepath.Join(b.TempDir(), storFile), 0o600, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer db.Close()
				if err := db.Update(func(tx *bolt.Tx) error {
					_, err := tx.CreateBucket(storBucketEntries)
					return err
				}); err != nil {
					b.Fatal(err)
				}
				dbs[i] = db
			}
			concurrentCommits(b, writers, func(w int, op uint64) error {
				return dbs[w].Update(func(tx *bolt.Tx) error {
					bk := tx.Bucket(storBucketEntries)
					bk.FillPercent = 0.95
					for _, e := range storTestEntries(op*uint64(n)+1, (op+1)*uint64(n), ballot) {
						v, err := json.Marshal(e)
						if err != nil {
							return err
						}
						if err := bk.Put(storU64(e.Slot), v); err != nil {
							return err
						}
					}
					return nil
				})
			})
		})
	}
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
