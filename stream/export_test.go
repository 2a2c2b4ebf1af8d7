package stream

import (
	"context"
	"time"
)

// SetNow replaces w's clock.
func SetNow(w *Writer, now func() time.Time) { w.now = now }

// SetBatchStreams bounds the streams of each of w's batches.
func SetBatchStreams(w *Writer, n int) { w.batchStreams = n }

// FlushTogether writes one event of each claim's attempt in one batch,
// as a group commit that took them together would, and returns each
// write's error.
func FlushTogether(ctx context.Context, w *Writer, claims []Claim, in Input) []error {
	var reqs []*request
	for _, c := range claims {
		reqs = append(reqs, &request{a: w.attempt(c), events: []Input{in}, at: w.now().UTC()})
	}
	w.flush(ctx, reqs)
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		errs[i] = r.err
	}
	return errs
}

// Write is one write of a batch FlushBatch takes: the events of claim
// C's attempt, or, with End set (AttemptEnded, Done), its end, as
// Attempt.End of an attempt that emitted writes it.
type Write struct {
	C      Claim
	Events []Input
	End    string
}

// FlushBatch writes ws in one batch, as a group commit that took them
// together would, and returns each write's error.
func FlushBatch(ctx context.Context, w *Writer, ws []Write) []error {
	var reqs []*request
	for _, x := range ws {
		r := &request{a: w.attempt(x.C), events: x.Events, at: w.now().UTC()}
		if x.End != "" {
			r.end = &Input{Type: x.End, Data: ownData{Attempt: x.C.Attempt, Outcome: "failed"}.raw()}
		}
		reqs = append(reqs, r)
	}
	w.flush(ctx, reqs)
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		errs[i] = r.err
	}
	return errs
}

// WriterRunning counts w's goroutines (sweeps, attempts' senders).
func WriterRunning(w *Writer) int { return w.crew.running() }

// HubRunning counts h's goroutines (watches).
func HubRunning(h *Hub) int { return h.crew.running() }

// Followers counts the followers of task id's watch, 0 if none is open.
func Followers(h *Hub, id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if wd := h.streams[id]; wd != nil {
		return len(wd.subs)
	}
	return 0
}

// SendQueued writes ins as at's outbox sends the events it queued: a
// send of events queued before End that goes after it.
func SendQueued(at *Attempt, ins []Input) error { return at.send(ins) }
