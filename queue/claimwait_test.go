package queue

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestClaimWaitsLine: the first claim to wait leads at once; the others
// wait in order; a lead that ends without a full claim passes to the next
// one alone, a full one wakes all of them (none leading); a claim whose
// wait ended (its context, or its deadline) leaves the line and the lead
// skips it.
func TestClaimWaitsLine(t *testing.T) {
	var cw claimWaits
	ctx := context.Background()
	far := time.Now().Add(time.Minute)
	lead, waited, ok := cw.join(ctx, "q", far)
	if !lead || waited || !ok {
		t.Fatalf("first join: lead %v waited %v ok %v; want it to lead at once", lead, waited, ok)
	}
	type result struct {
		id               int
		lead, waited, ok bool
	}
	results := make(chan result, 8)
	joinAs := func(ctx context.Context, id int, deadline time.Time) {
		l, w, o := cw.join(ctx, "q", deadline)
		results <- result{id, l, w, o}
	}
	lined := func(n int) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			cw.mu.Lock()
			got := 0
			if line := cw.queues["q"]; line != nil {
				got = len(line.waiting)
			}
			cw.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("%d claims in line, want %d", got, n)
			}
		}
	}
	// A claim whose deadline has passed leaves the line at once.
	go joinAs(ctx, 0, time.Now().Add(-time.Millisecond))
	if r := <-results; r.id != 0 || r.ok || r.lead {
		t.Fatalf("got %+v; want claim 0 out of the line: its deadline had passed", r)
	}
	lined(0)
	// Claim 1 leaves when its wait ends (here its context, so that the
	// test decides when, whatever the machine's load).
	ctx1, end1 := context.WithCancel(ctx)
	defer end1()
	go joinAs(ctx1, 1, far)
	lined(1)
	go joinAs(ctx, 2, far)
	lined(2)
	go joinAs(ctx, 3, far)
	lined(3)
	end1()
	if r := <-results; r.id != 1 || r.ok || r.lead {
		t.Fatalf("got %+v; want claim 1 out of the line when its wait ended", r)
	}
	cw.leave("q", false)
	if r := <-results; r.id != 2 || !r.lead || !r.waited || !r.ok {
		t.Fatalf("got %+v; want claim 2 (claim 1 left) to lead", r)
	}
	select {
	case r := <-results:
		t.Fatalf("claim %d went on while claim 2 led", r.id)
	case <-time.After(50 * time.Millisecond):
	}
	go joinAs(ctx, 4, far)
	lined(2)
	cw.leave("q", true) // claim 2's claim was full: everyone claims
	for range 2 {
		if r := <-results; r.lead || !r.ok || !r.waited {
			t.Fatalf("got %+v; want claims 3 and 4 woken, neither leading", r)
		}
	}
	if lead, _, _ := cw.join(ctx, "q", far); !lead {
		t.Fatal("after a full claim woke the line, the next claim to wait should lead")
	}
	cw.leave("q", false)
	if len(cw.queues) != 0 {
		t.Fatalf("%d lines left with no claim waiting", len(cw.queues))
	}
}

// TestClaimWaitsLeadNeverDropped: claims whose waits end while the lead is
// passed to them pass it on, so that whenever claims wait one of them
// leads (run with -race).
func TestClaimWaitsLeadNeverDropped(t *testing.T) {
	var cw claimWaits
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 50; k++ {
				wait := time.Duration((i*7+k)%5) * time.Millisecond
				lead, _, ok := cw.join(context.Background(), "q", time.Now().Add(wait))
				if ok && lead {
					time.Sleep(50 * time.Microsecond)
					cw.leave("q", k%3 == 0)
				}
			}
		}()
	}
	wg.Wait()
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if line := cw.queues["q"]; line != nil {
		t.Fatalf("line left: led %v, %d waiting; a lead was dropped or kept", line.led, len(line.waiting))
	}
}
