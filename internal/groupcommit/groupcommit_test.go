package groupcommit_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/groupcommit"
)

// item is one caller's work: its number, and the batch that sent it.
type item struct {
	n     int
	batch int64
}

// TestLine: 64 callers join one Line at once; each is sent exactly once,
// by one sender at a time, in batches that the fits rule bounds to 8; at
// least one batch holds more than one caller (they waited for a send in
// progress), and no caller is left waiting.
func TestLine(t *testing.T) {
	var line groupcommit.Line[*item]
	var sending, batches atomic.Int64
	var wg sync.WaitGroup
	sent := make([]atomic.Int32, 64)
	var biggest atomic.Int64
	for n := 0; n < 64; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it := &item{n: n}
			if !line.Join(it) {
				if it.batch == 0 {
					t.Errorf("caller %d answered without being sent", n)
				}
				return
			}
			if sending.Add(1) != 1 {
				t.Error("two senders at once")
			}
			items, calls := line.Take(func(taken []*item, _ *item) bool { return len(taken) < 8 })
			if items[0] != it {
				t.Errorf("the sender's item is not first in its batch")
			}
			b := batches.Add(1)
			time.Sleep(time.Millisecond) // the send: others arrive meanwhile
			for _, x := range items {
				x.batch = b
				sent[x.n].Add(1)
			}
			if int64(len(items)) > biggest.Load() {
				biggest.Store(int64(len(items)))
			}
			sending.Add(-1)
			groupcommit.Answer(calls)
			line.HandOn()
		}()
	}
	wg.Wait()
	for n := range sent {
		if c := sent[n].Load(); c != 1 {
			t.Fatalf("caller %d sent %d times", n, c)
		}
	}
	if b := biggest.Load(); b < 2 || b > 8 {
		t.Fatalf("largest batch %d: want 2 to 8", b)
	}
	t.Logf("64 callers in %d batches", batches.Load())
}
