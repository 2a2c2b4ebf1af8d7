package qstats

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// within says whether got is within the buckets' resolution (9.1%) of want.
func within(got, want time.Duration) bool {
	return math.Abs(float64(got-want)) <= 0.091*float64(want)
}

func TestLatencyPercentiles(t *testing.T) {
	l := Latency{}
	for i := 1; i <= 100; i++ { // 1 s to 100 s, one each
		l[bucketOf(time.Duration(i)*time.Second)]++
	}
	for _, c := range []struct {
		name string
		p    float64
		want time.Duration
	}{
		{"p50", 0.50, 50 * time.Second},
		{"p99", 0.99, 99 * time.Second},
		{"p10", 0.10, 10 * time.Second},
	} {
		if got := l.Percentile(c.p); !within(got, c.want) {
			t.Errorf("%s = %v, want %v ± 9%%", c.name, got, c.want)
		}
	}
	if (Latency{}).Percentile(0.5) != 0 {
		t.Error("a percentile of no samples is not 0")
	}
	if bucketOf(0) != 0 || bucketOf(1000*time.Hour) != latencyBuckets-1 {
		t.Error("bucket bounds")
	}
}

// A run claimed on a segment counts its first attempts, each waited from
// the segment's time to the run's claim; the history's percentiles come
// from those known times.
func TestLatencyFromSegmentRuns(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	keys := keyspace.MustNew(ns)
	r := startRecorder(t, cli, ns, false)
	submitted := time.Date(2026, 11, 28, 11, 0, 0, 0, time.UTC)
	// 99 tasks waited 2 s, one 30 s and one (a second attempt) is not counted.
	waits := []struct {
		seg      string
		after    time.Duration
		attempts []int
	}{
		{keyspace.SegmentName(990, submitted, "a"), 2 * time.Second, make([]int, 99)},
		{keyspace.SegmentName(990, submitted.Add(time.Second), "b"), 30 * time.Second, []int{1, 2}},
	}
	for i, w := range waits {
		_, at, _ := keyspace.ParseSegmentName(w.seg)
		slots := make([]int, len(w.attempts))
		for j := range slots {
			slots[j] = j
			if w.attempts[j] == 0 {
				w.attempts[j] = 1
			}
		}
		v := taskstore.Run{Worker: "w", ClaimedAt: at.Add(w.after), Slots: slots, Attempts: w.attempts}.Encode()
		if _, err := cli.Put(context.Background(), keys.Run("lat", w.seg, keyspace.RunName(len(slots), "r", int64(i))), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	waitCounted(t, r, "lat", Counts{Started: 100})
	if _, err := r.CloseMinute(context.Background(), t0); err != nil {
		t.Fatal(err)
	}
	h, err := Read(context.Background(), cli, ns, "lat", Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if p50 := h.Latency.Percentile(0.5); !within(p50, 2*time.Second) {
		t.Errorf("p50 %v, want 2 s", p50)
	}
	if p99 := h.Latency.Percentile(0.99); !within(p99, 2*time.Second) {
		t.Errorf("p99 %v, want 2 s (99 of 100 waited 2 s)", p99)
	}
	if max := h.Latency.Percentile(1); !within(max, 30*time.Second) {
		t.Errorf("max %v, want 30 s", max)
	}
}

// Depth: a record keeps the queue's depth at the minute's end; a minute
// without a record carries the depth before it.
func TestHistoryDepth(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	depth := map[string]Depth{"d": {Pending: 7, Running: 2}}
	r, err := NewRecorder(Config{Client: cli, Namespace: ns, Manual: true, Depth: func() map[string]Depth { return depth }})
	if err != nil {
		t.Fatal(err)
	}
	r.Start(context.Background())
	defer r.Stop(context.Background())
	<-r.Ready()
	if closed, err := r.CloseMinute(context.Background(), t0); err != nil || !closed {
		t.Fatalf("close: %v %v", closed, err)
	}
	m2 := t0.Add(2 * time.Minute)
	if closed, err := r.CloseMinute(context.Background(), m2); err != nil || !closed {
		t.Fatalf("close: %v %v", closed, err)
	}
	n, _ := cli.Get(context.Background(), keyspace.MustNew(ns).QueueHistoryMinutes("d"), clientVPrefix()...)
	if n.Count != 1 {
		t.Errorf("%d records for an unchanged depth, want 1", n.Count)
	}
	h, err := Read(context.Background(), cli, ns, "d", Hour, m2.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []time.Time{t0, t0.Add(time.Minute), m2} {
		if got := minuteOf(h, m); got.Depth != depth["d"] || !got.Closed {
			t.Errorf("minute %v: depth %+v closed %v, want %+v", m, got.Depth, got.Closed, depth["d"])
		}
	}
	if got := minuteOf(h, m2.Add(time.Minute)); got.Closed {
		t.Error("a minute after the mark reads as closed")
	}
}

func clientVPrefix() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}
}

// On the clock, a minute is closed a little after it ends, and not long
// after: a late close would take in the next minute's events.
func TestCloseDueOnTheClock(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	var now time.Time
	r, err := NewRecorder(Config{Client: cli, Namespace: ns, Manual: true, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	r.Start(context.Background())
	defer r.Stop(context.Background())
	<-r.Ready()
	closed := func() time.Time {
		h, err := Read(context.Background(), cli, ns, "any", Hour, t0)
		if err != nil {
			t.Fatal(err)
		}
		return h.ClosedThrough
	}
	for _, step := range []struct {
		at   time.Time
		want time.Time // the mark's minute after the step
	}{
		{t0.Add(time.Second), time.Time{}},                           // too early
		{t0.Add(3 * time.Second), t0.Add(-time.Minute)},              // closes the minute that ended
		{t0.Add(time.Minute + 30*time.Second), t0.Add(-time.Minute)}, // too late for t0: left to the next
		{t0.Add(2*time.Minute + 3*time.Second), t0.Add(time.Minute)}, // closes t0+1m
		{t0.Add(2*time.Minute + 8*time.Second), t0.Add(time.Minute)}, // once
	} {
		now = step.at
		r.closeDue(context.Background())
		if got := closed(); !got.Equal(step.want) {
			t.Errorf("at %v: closed through %v, want %v", step.at, got, step.want)
		}
	}
}

// Squashing keeps every count and the revision order.
func TestSquashKeepsCounts(t *testing.T) {
	var ds []delta
	var want Counts
	for i := range 1000 {
		d := delta{rev: int64(i + 1), q: []string{"a", "b"}[i%2], c: Counts{Processed: 1, Started: int64(i % 3)}, lat: i % 5}
		ds = append(ds, d)
		want.add(d.c)
	}
	out := squash(ds)
	var got Counts
	for i, d := range out {
		got.add(d.c)
		if i > 0 && d.rev < out[i-1].rev {
			t.Fatal("revisions out of order")
		}
	}
	if got != want || len(out) >= len(ds) {
		t.Errorf("squashed %d into %d: %+v, want %+v", len(ds), len(out), got, want)
	}
}
