package qstats

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// take counts a watch response's events.
func (r *Recorder) take(wr clientv3.WatchResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if wr.IsProgressNotify() {
		// A progress notice: every event up to its revision was sent.
		r.through = max(r.through, wr.Header.Revision)
		return
	}
	for _, ev := range wr.Events {
		rev := ev.Kv.ModRevision
		r.through = max(r.through, rev)
		key := string(ev.Kv.Key)
		if key == r.keys.QueueHistoryMark() {
			r.checkClockLocked(ev.Kv.Value, rev) // a put: the watch filters deletions out
			r.setMarkLocked(ev.Kv.Value, rev)
			continue
		}
		if q, m, ok := r.keys.ParseQueueHistoryMinute(key); ok {
			if rec, err := decodeRecord(ev.Kv.Value); err == nil && !rec.Unknown {
				r.noteDepthLocked(q, rec.Depth, m.Unix())
			}
			continue
		}
		if !ev.IsCreate() {
			continue // the counted keys are each written once, at their creation
		}
		d, ok := classify(r.keys, key, ev.Kv.Value)
		if !ok {
			continue
		}
		d.rev = rev
		if rev >= r.observeFrom && r.cfg.Metrics {
			observe(d)
		}
		if rev > r.mk.Rev {
			r.deltas = append(r.deltas, d)
		}
	}
	if len(r.deltas) > maxDeltas {
		r.deltas = squash(r.deltas)
	}
}

// checkClockLocked warns when a mark another server wrote was closed
// later, by its clock, than this server's clock says now by more than
// skewTolerance: that server's clock runs ahead, and it closes minutes
// early (a watch that lags only makes the mark look older).
func (r *Recorder) checkClockLocked(v []byte, mod int64) {
	m, err := decodeMark(v)
	if err != nil || m.At == 0 || mod == r.markMod {
		return
	}
	ahead := time.UnixMilli(m.At).Sub(r.cfg.Now())
	if ahead > skewTolerance {
		r.cfg.Logger.Warn("queue history: the server that closed a minute has a clock ahead of this server's; "+
			"each minute takes in that much of the next: synchronize the servers' clocks (NTP)",
			"minute", time.Unix(m.Minute, 0).UTC(), "ahead", ahead.Round(time.Millisecond))
	}
}

// maxDeltas bounds the events kept while no minute can be closed (the
// store refuses writes, say, or a burst of more than about a thousand
// events a second): past it the older half is summed in spans (see
// squash).
const maxDeltas = 1 << 16

// spanEvents is how many kept events a span sums at first: about a
// second of a busy namespace's events.
const spanEvents = 1 << 10

// squash sums the older half of ds in spans of consecutive events, by
// queue and latency bucket, each sum at its span's last revision; a
// revision is never split between spans. A mark (another server's) that
// falls inside a span then takes or leaves the span whole, so a minute
// may be off by at most one span's events; the rest stays exact. When
// the sums do not shrink ds enough (many queues), the spans double.
func squash(ds []delta) []delta {
	half := len(ds) / 2
	for span := spanEvents; ; span *= 2 {
		out := squashSpans(ds[:half], span)
		if len(out) <= half/2 || span >= half {
			return append(out, ds[half:]...)
		}
	}
}

func squashSpans(ds []delta, span int) []delta {
	type k struct {
		q   string
		lat int
	}
	out := make([]delta, 0, len(ds)/4)
	for start := 0; start < len(ds); {
		end := min(start+span, len(ds))
		for end < len(ds) && ds[end].rev == ds[end-1].rev {
			end++
		}
		last := ds[end-1].rev
		at := map[k]int{}
		for _, d := range ds[start:end] {
			key := k{d.q, d.lat}
			i, ok := at[key]
			if !ok {
				i = len(out)
				at[key] = i
				out = append(out, delta{q: d.q, lat: d.lat, rev: last})
			}
			out[i].c.add(d.c)
		}
		start = end
	}
	return out
}

// classify reads what a queue key created says: a batch of outcomes
// (those that succeeded), a task that succeeded with a record of its own,
// a dead task, a retry or a deferral (the retry schedule's value says
// which), or a run claimed on a segment (the tasks started, and their
// latency from the segment's time to the run's claim).
func classify(keys keyspace.Space, key string, value []byte) (delta, bool) {
	q, kind, rest, ok := keys.ParseQueueKey(key)
	if !ok {
		return delta{}, false
	}
	d := delta{q: q}
	switch kind {
	case "outs":
		_, name, _ := strings.Cut(rest, "/")
		_, n, _, valid := keyspace.ParseOutName(name)
		d.c.Processed = int64(n)
		return d, valid && n > 0
	case "done":
		d.c.Processed = 1
		return d, strings.HasPrefix(rest, "SUCCEEDED/") // the status of queue.Succeeded
	case "dead":
		d.c.Failed = 1
		return d, rest != ""
	case "retry":
		var v struct {
			Deferred string `json:"d"`
		}
		if json.Unmarshal(value, &v) == nil && v.Deferred != "" {
			d.c.Deferred = 1
		} else {
			d.c.Retried = 1
		}
		return d, true
	case "runs":
		return runDelta(d, rest, value)
	}
	return d, false
}

// runDelta counts a run: the slots it starts for the first time, each
// waited from the segment's time (its submission, or its due time for a
// delayed segment) to the run's claim.
func runDelta(d delta, rest string, value []byte) (delta, bool) {
	seg, _, _ := strings.Cut(rest, "/")
	_, at, ok := keyspace.ParseSegmentName(seg)
	if !ok {
		return d, false
	}
	run, err := taskstore.DecodeRun(value)
	if err != nil {
		return d, false
	}
	for i := range run.Slots {
		if i >= len(run.Attempts) || run.Attempts[i] <= 1 {
			d.c.Started++
		}
	}
	d.lat = bucketOf(max(run.ClaimedAt.Sub(at), 0))
	if d.c.Started > 0 {
		d.latency = max(run.ClaimedAt.Sub(at), 0)
	}
	return d, d.c.Started > 0
}

// observe adds an event to the metrics.
func observe(d delta) {
	add := func(n int64, c interface{ Add(float64) }) {
		if n > 0 {
			c.Add(float64(n))
		}
	}
	add(d.c.Processed, metrics.QueueProcessed.WithLabelValues(d.q))
	add(d.c.Failed, metrics.QueueFailed.WithLabelValues(d.q))
	add(d.c.Retried, metrics.QueueRetried.WithLabelValues(d.q))
	add(d.c.Deferred, metrics.QueueDeferred.WithLabelValues(d.q))
	if d.c.Started > 0 {
		h := metrics.QueueStartLatency.WithLabelValues(d.q)
		for range d.c.Started {
			h.Observe(d.latency.Seconds())
		}
	}
}
