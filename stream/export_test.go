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

// Followers counts the followers of task id's watch, 0 if none is open.
func Followers(h *Hub, id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if wd := h.streams[id]; wd != nil {
		return len(wd.subs)
	}
	return 0
}
