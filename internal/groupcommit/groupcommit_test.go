package groupcommit_test

import (
	"context"
	"errors"
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

// TestJoinContextLeavesUnsent: a caller waiting in line whose context
// ends leaves with its error and is never taken into a batch; a caller
// whose item was taken waits for its answer even after its context ends.
func TestJoinContextLeavesUnsent(t *testing.T) {
	var line groupcommit.Line[*item]
	if lead, err := line.JoinContext(context.Background(), &item{n: 0}); !lead || err != nil {
		t.Fatalf("the first caller: lead %t, err %v", lead, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := line.JoinContext(ctx, &item{n: 1})
		left <- err
	}()
	taken := make(chan bool, 1)
	go func() {
		lead, err := line.JoinContext(context.Background(), &item{n: 2})
		taken <- lead && err == nil
	}()
	// Wait (bounded) until both wait in line behind the sender.
	for i := 0; ; i++ {
		if i == 10_000 {
			t.Fatal("the callers never joined the line")
		}
		if groupcommit.Waiting(&line) == 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled caller: %v, want context.Canceled", err)
	}
	items, calls := line.Take(func([]*item, *item) bool { return true })
	if len(items) != 2 || items[1].n != 2 {
		t.Fatalf("the batch holds %d items (second %d): the cancelled caller's was taken", len(items), items[len(items)-1].n)
	}
	groupcommit.Answer(calls)
	line.HandOn()
	if lead := <-taken; lead {
		t.Fatal("the sent caller was made a sender")
	}
}
