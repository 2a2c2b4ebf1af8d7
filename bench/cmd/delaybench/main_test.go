package main

import (
	"testing"
	"time"
)

// TestSummaryCountsWhatWasClaimed fills a plan's records directly (no
// clock): percentiles over the tasks claimed by the deadline, early ones
// counted with the earliest, a second run counted apart.
func TestSummaryCountsWhatWasClaimed(t *testing.T) {
	p := newPlan(100, 64, time.Second, time.Second, time.Hour)
	for i := range 90 { // 10 never claimed
		p.seen[i].Store(2)
		p.late[i] = int64(i) * int64(time.Millisecond)
	}
	p.late[0] = -int64(300 * time.Millisecond)
	p.late[1] = -int64(5 * time.Millisecond)
	p.claim(5) // a second run of task 5
	p.claim(-1)
	p.claim(100)
	r := p.summary("x", "cfg", time.Second)
	if r.Claimed != 90 || r.Early != 2 || r.EarlyMaxMs != 300 || r.Duplicates != 1 {
		t.Fatalf("claimed %d, early %d (most %v ms), duplicates %d; want 90, 2 (300 ms), 1", r.Claimed, r.Early, r.EarlyMaxMs, r.Duplicates)
	}
	if r.P50Ms != 45 || r.P99Ms != 89 || r.MaxMs != 89 {
		t.Fatalf("p50 %v, p99 %v, max %v ms; want 45, 89, 89", r.P50Ms, r.P99Ms, r.MaxMs)
	}
}

// TestClaimAfterTheDeadlineIsNotCounted: a plan whose deadline has passed
// records no lateness and never reports all claimed.
func TestClaimAfterTheDeadlineIsNotCounted(t *testing.T) {
	p := newPlan(1, 1, time.Second, 0, -time.Hour)
	p.claim(0)
	select {
	case <-p.all:
		t.Fatal("a claim past the deadline counted")
	default:
	}
	if r := p.summary("x", "", 0); r.Claimed != 0 {
		t.Fatalf("claimed %d past the deadline", r.Claimed)
	}
}
