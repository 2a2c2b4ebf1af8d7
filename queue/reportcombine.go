package queue

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Outcomes reported at the same time by different external workers (the
// HTTP API's sessions, each with its own request) are written together: the
// first report to arrive while none is being written writes its own and
// every report that arrived meanwhile, in one report of up to MaxReport
// outcomes, and hands the writing on to the next one waiting. Each outcome
// is still fenced by its own claim and answered on its own; what the
// reports share is etcd's round trips: one read of where the tasks are, one
// of their runs, and one transaction that writes the outcomes of many runs,
// instead of three for each report. A report never waits for a timer: one
// that arrives alone is written at once (group commit).

// reportWriteTimeout bounds a combined report: it is not cut short by one
// reporter's context, since it writes the others' outcomes too.
const reportWriteTimeout = 30 * time.Second

// reportCombiner queues the reports of one Client that wait for the one
// being written. The zero value is ready.
type reportCombiner struct {
	mu      sync.Mutex
	writing bool
	waiting []*reportCall
	// writes counts the combined reports written, reports the reports in
	// them.
	writes, reports atomic.Int64
}

// reportCall is one report waiting to be written: its outcomes, their
// answers once written, and done, closed when they are there or when the
// call is to write the next combined report itself (lead).
type reportCall struct {
	os   []Outcome
	out  []Reported
	lead bool
	done chan struct{}
}

// reportCombined is report, written together with the reports of other
// callers that arrive at the same time.
func (c *Client) reportCombined(ctx context.Context, os []Outcome) []Reported {
	rc := &c.reports
	call := &reportCall{os: os, done: make(chan struct{})}
	rc.mu.Lock()
	rc.waiting = append(rc.waiting, call)
	if rc.writing {
		rc.mu.Unlock()
		<-call.done // the writer always answers: no context can cut this short
		if !call.lead {
			return call.out
		}
	} else {
		rc.writing = true
		rc.mu.Unlock()
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportWriteTimeout)
	defer cancel()
	batch := rc.take()
	var all []Outcome
	for _, b := range batch {
		all = append(all, b.os...)
	}
	out := c.report(wctx, all)
	rc.writes.Add(1)
	rc.reports.Add(int64(len(batch)))
	for _, b := range batch {
		b.out, out = out[:len(b.os)], out[len(b.os):]
		if b != call {
			close(b.done)
		}
	}
	rc.handOn()
	return call.out
}

// take removes from the waiting reports those the next combined report
// writes: the first, and those after it while the outcomes stay within
// MaxReport.
func (rc *reportCombiner) take() []*reportCall {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n, size := 0, 0
	for _, w := range rc.waiting {
		if n > 0 && size+len(w.os) > MaxReport {
			break
		}
		n, size = n+1, size+len(w.os)
	}
	batch := rc.waiting[:n:n]
	rc.waiting = rc.waiting[n:]
	return batch
}

// handOn makes the first waiting report the writer of the next combined
// report, or ends the writing when none waits.
func (rc *reportCombiner) handOn() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.waiting) == 0 {
		rc.writing = false
		rc.waiting = nil
		return
	}
	next := rc.waiting[0]
	next.lead = true
	close(next.done)
}
