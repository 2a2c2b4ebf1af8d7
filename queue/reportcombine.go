package queue

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/internal/groupcommit"
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
	line groupcommit.Line[*reportCall]
	// writes counts the combined reports written, reports the reports in
	// them.
	writes, reports atomic.Int64
}

// reportCall is one report: its outcomes, and their answers once written.
type reportCall struct {
	os  []Outcome
	out []Reported
}

// reportCombined is report, written together with the reports of other
// callers that arrive at the same time.
func (c *Client) reportCombined(ctx context.Context, os []Outcome) []Reported {
	rc := &c.remote.reports
	call := &reportCall{os: os}
	if !rc.line.Join(call) {
		return call.out
	}
	// The next combined report: the first waiting, and those after it
	// while the outcomes stay within MaxReport.
	batch, calls := rc.line.Take(func(taken []*reportCall, next *reportCall) bool {
		size := len(next.os)
		for _, t := range taken {
			size += len(t.os)
		}
		return size <= MaxReport
	})
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportWriteTimeout)
	defer cancel()
	var all []Outcome
	for _, b := range batch {
		all = append(all, b.os...)
	}
	out := c.report(wctx, all)
	rc.writes.Add(1)
	rc.reports.Add(int64(len(batch)))
	for _, b := range batch {
		b.out, out = out[:len(b.os)], out[len(b.os):]
	}
	groupcommit.Answer(calls)
	rc.line.HandOn()
	return call.out
}
