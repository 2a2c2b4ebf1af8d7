package qstats

import (
	"encoding/json"
	"testing"
)

// Squashing sums events in spans: a mark that falls anywhere in the
// squashed events counts at most one span's events wrong.
func TestSquashErrorIsOneSpan(t *testing.T) {
	const n = 4 * maxDeltas
	ds := make([]delta, 0, n)
	for i := range n {
		ds = append(ds, delta{rev: int64(i + 1), q: []string{"a", "b", "c"}[i%3], c: Counts{Processed: 1}, lat: i % 7})
	}
	out := squash(ds)
	if len(out) > 3*n/4 {
		t.Errorf("squashed %d events into %d", n, len(out))
	}
	for _, mk := range []int64{1, 777, n / 8, n/2 - 3, n / 2, n - 1} {
		var exact, got int64
		for _, d := range ds {
			if d.rev > mk {
				exact += d.c.Processed
			}
		}
		for _, d := range out {
			if d.rev > mk {
				got += d.c.Processed
			}
		}
		if diff := got - exact; diff > spanEvents || -diff > spanEvents {
			t.Errorf("mark at %d: %d events after it, squashed %d: off by more than a span (%d)", mk, exact, got, spanEvents)
		}
	}
}

// Once a burst's events are closed into a minute, the memory they held
// goes too.
func TestMarkReleasesBurstMemory(t *testing.T) {
	r, err := NewRecorder(Config{Client: srv.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxDeltas {
		r.deltas = append(r.deltas, delta{rev: int64(i + 1), q: "a", c: Counts{Processed: 1}})
	}
	v, _ := json.Marshal(mark{Minute: t0.Unix(), Rev: maxDeltas - 10})
	r.mu.Lock()
	r.setMarkLocked(v, maxDeltas+1)
	got, capacity := len(r.deltas), cap(r.deltas)
	r.mu.Unlock()
	if got != 10 || capacity > 4*spanEvents {
		t.Errorf("after the mark: %d events kept in room for %d", got, capacity)
	}
}
