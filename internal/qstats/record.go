package qstats

import (
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"time"
)

// Counts are what one minute of a queue counts.
type Counts struct {
	// Processed: tasks that succeeded.
	Processed int64 `json:"p,omitempty"`
	// Failed: tasks that failed for good (moved to the dead-letter queue).
	Failed int64 `json:"f,omitempty"`
	// Retried: failed attempts scheduled for another attempt.
	Retried int64 `json:"r,omitempty"`
	// Deferred: tasks handed back by flow control (a full quota, an open
	// breaker), not charged an attempt.
	Deferred int64 `json:"d,omitempty"`
	// Started: tasks of segments claimed (the latency's samples).
	Started int64 `json:"s,omitempty"`
}

func (c *Counts) add(o Counts) {
	c.Processed += o.Processed
	c.Failed += o.Failed
	c.Retried += o.Retried
	c.Deferred += o.Deferred
	c.Started += o.Started
}

// Depth is a queue's unfinished tasks by state.
type Depth struct {
	Pending  int64 `json:"qp,omitempty"`
	Running  int64 `json:"qr,omitempty"`
	Retrying int64 `json:"qt,omitempty"`
}

// record is a minute record's stored form.
type record struct {
	Counts
	Depth
	// Latency counts the samples of submission-to-start latency by
	// bucket (see bucketOf).
	Latency map[string]int64 `json:"l,omitempty"`
	// Gap: the server that wrote the record had not seen every event
	// since the minute before (it started after the store compacted the
	// revisions it would have read): the counts may be short.
	Gap bool `json:"g,omitempty"`
	// Unknown: the server that wrote the record did not know the queue's
	// depth (it had just started); a reader carries the depth before.
	Unknown bool `json:"u,omitempty"`
}

func (r record) encode() []byte {
	b, _ := json.Marshal(r)
	return b
}

func decodeRecord(b []byte) (record, error) {
	var r record
	err := json.Unmarshal(b, &r)
	return r, err
}

// mark is the mark's stored form: the minute closed last (Unix seconds of
// its start) and the store revision its counts go through.
type mark struct {
	Minute int64 `json:"m"`
	Rev    int64 `json:"rev"`
	// At is when the server that closed the minute closed it, by its
	// clock (Unix milliseconds): the others compare it with theirs.
	At int64 `json:"at,omitempty"`
}

// The latency's buckets: bucket i holds latencies up to latencyBase ×
// 2^(i/latencySteps); bucket 0 everything up to latencyBase. Four steps a
// doubling make a percentile read off a bucket's middle within about 9% of
// the true value, and 120 buckets reach past a day.
const (
	latencyBase    = time.Millisecond
	latencySteps   = 4
	latencyBuckets = 120
)

// bucketOf is the bucket of latency d.
func bucketOf(d time.Duration) int {
	if d <= latencyBase {
		return 0
	}
	i := int(math.Ceil(math.Log2(float64(d)/float64(latencyBase)) * latencySteps))
	return min(max(i, 0), latencyBuckets-1)
}

// bucketMiddle is the latency a percentile that falls in bucket i reads:
// the geometric middle of the bucket's bounds.
func bucketMiddle(i int) time.Duration {
	if i == 0 {
		return latencyBase / 2
	}
	return time.Duration(float64(latencyBase) * math.Exp2((float64(i)-0.5)/latencySteps))
}

// Latency is a sparse histogram of latencies.
type Latency map[int]int64

func (l Latency) add(o Latency) {
	for b, n := range o {
		l[b] += n
	}
}

// Count is the number of samples.
func (l Latency) Count() int64 {
	var n int64
	for _, c := range l {
		n += c
	}
	return n
}

// Percentile is the latency below which fraction p (0 to 1) of the
// samples fall, read off the bucket's middle; 0 without samples.
func (l Latency) Percentile(p float64) time.Duration {
	total := l.Count()
	if total == 0 {
		return 0
	}
	keys := make([]int, 0, len(l))
	for b := range l {
		keys = append(keys, b)
	}
	sort.Ints(keys)
	rank := int64(math.Ceil(p * float64(total)))
	rank = max(rank, 1)
	var seen int64
	for _, b := range keys {
		seen += l[b]
		if seen >= rank {
			return bucketMiddle(b)
		}
	}
	return bucketMiddle(keys[len(keys)-1])
}

func (l Latency) stored() map[string]int64 {
	if len(l) == 0 {
		return nil
	}
	out := make(map[string]int64, len(l))
	for b, n := range l {
		out[strconv.Itoa(b)] = n
	}
	return out
}

func latencyOf(m map[string]int64) Latency {
	l := Latency{}
	for k, n := range m {
		if b, err := strconv.Atoi(k); err == nil && b >= 0 && b < latencyBuckets {
			l[b] += n
		}
	}
	return l
}
