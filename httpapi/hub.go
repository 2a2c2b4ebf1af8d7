package httpapi

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/droverhq/drover/internal/qstats"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The hub's bounds: it follows at most hubSpacesMax namespaces (the
// server's own and those asked for since), forgets one nobody asked for in
// hubIdle, and keeps historyWindow of samples.
const (
	hubSpacesMax  = 16
	hubIdle       = time.Hour
	historyWindow = time.Hour
	// hubReadTimeout bounds one round of reads of a namespace.
	hubReadTimeout = 5 * time.Second
	// subSamplesMax bounds the samples a slow stream has not sent yet.
	subSamplesMax = 16
)

// hubPoll is how often the hub reads a namespace that someone follows
// (GET /v1/events); a variable so that tests can shorten it.
var hubPoll = time.Second

// hub reads, for each namespace it follows, every queue's counts and the
// state of locks, the registry and flow control, and hands them to the
// event streams of that namespace (events.go); it also keeps the history
// of processed and failed tasks per second (history.go). One goroutine,
// started by Serve (or by the first request that needs it) and ended by
// Close, does every read: the cost does not grow with the streams open.
type hub struct {
	s        *Server
	interval time.Duration // between two history samples

	startOnce sync.Once
	stopOnce  sync.Once
	stop      chan struct{}
	done      chan struct{}
	ctx       context.Context // ends with close: the reads under way end too
	cancel    context.CancelFunc

	mu     sync.Mutex
	spaces map[string]*space
	// exported are the queues of the server's own namespace whose
	// drover_queue_tasks gauges are set (h.mu held).
	exported map[string]bool
}

// space is what the hub keeps of one namespace.
type space struct {
	ns      string
	home    bool      // the server's own namespace: never forgotten
	usedAt  time.Time // last asked for
	samples ring
	prev    *totals // the counts at the last sample
	last    *view   // the last read
	subs    map[*subscriber]struct{}
	// rec keeps the history of the namespace's queues (package
	// internal/qstats) with the depths this hub reads, while the hub
	// follows the namespace.
	rec *qstats.Recorder
}

// totals are the counts a sample is computed from.
type totals struct {
	at        time.Time
	succeeded int64
	dead      int64
}

// view is one read of a namespace: the queues with their counts, and a
// fingerprint of each other topic (count and highest mod revision of its
// keys), which changes whenever one of its keys does.
type view struct {
	queues []QueueSummary
	prints map[string][2]int64
}

// The topics of a changed event, and the key prefixes each covers.
var topicPrefixes = map[string]func(keyspace.Space) []string{
	"locks":    func(k keyspace.Space) []string { return []string{k.Locks()} },
	"registry": func(k keyspace.Space) []string { return []string{k.Components()} },
	"flow":     func(k keyspace.Space) []string { return []string{k.Limits(), k.Quotas(), k.Breakers()} },
}

func newHub(s *Server, interval time.Duration) *hub {
	ctx, cancel := context.WithCancel(context.Background())
	return &hub{s: s, interval: interval, stop: make(chan struct{}), done: make(chan struct{}), ctx: ctx, cancel: cancel,
		spaces: map[string]*space{}}
}

// start starts the hub's goroutine once; after close it does nothing.
func (h *hub) start() {
	h.startOnce.Do(func() {
		select {
		case <-h.stop:
			close(h.done)
			return
		default:
		}
		h.mu.Lock()
		h.spaceLocked(h.s.cfg.Namespace).home = true
		h.mu.Unlock()
		go h.run()
	})
}

// close stops the goroutine and waits for it; safe twice and before start.
func (h *hub) close() {
	h.stopOnce.Do(func() {
		close(h.stop)
		h.cancel()
	})
	h.startOnce.Do(func() { close(h.done) })
	<-h.done
	h.mu.Lock()
	var recs []*qstats.Recorder
	for _, sp := range h.spaces {
		recs = append(recs, sp.rec)
	}
	h.mu.Unlock()
	stopRecorders(recs)
}

// newRecorder starts the queue history's recorder of namespace ns (h.mu
// held); its minutes keep the depths the hub read last. The server's own
// namespace exports its counts as metrics.
func (h *hub) newRecorder(ns string) *qstats.Recorder {
	home := ns == h.s.cfg.Namespace
	rec, err := qstats.NewRecorder(qstats.Config{Client: h.s.cli, Namespace: ns, Metrics: home,
		Logger: h.s.cfg.Logger, Depth: func() map[string]qstats.Depth { return h.depths(ns) }})
	if err != nil {
		h.s.cfg.Logger.Warn("queue history: not kept", "namespace", ns, "err", err)
		return nil
	}
	rec.Start(h.ctx)
	return rec
}

// stopRecorders stops recs, h.mu not held (a recorder closing a minute
// reads the depths under it).
func stopRecorders(recs []*qstats.Recorder) {
	for _, rec := range recs {
		if rec != nil {
			_ = rec.Stop(context.Background())
		}
	}
}

// depths are the queues' depths of namespace ns as last read; nil before
// the first read.
func (h *hub) depths(ns string) map[string]qstats.Depth {
	h.mu.Lock()
	defer h.mu.Unlock()
	sp := h.spaces[ns]
	if sp == nil || sp.last == nil {
		return nil
	}
	out := make(map[string]qstats.Depth, len(sp.last.queues))
	for _, q := range sp.last.queues {
		out[q.Name] = qstats.Depth{Pending: q.Pending, Running: q.Running, Retrying: q.Retrying}
	}
	return out
}

func (h *hub) run() {
	defer close(h.done)
	tick := time.NewTicker(min(hubPoll, h.interval))
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case now := <-tick.C:
			h.round(now)
		}
	}
}

// round reads every namespace that is followed or due for a sample, and
// forgets the idle ones.
func (h *hub) round(now time.Time) {
	h.mu.Lock()
	var due []*space
	var forgotten []*qstats.Recorder
	for ns, sp := range h.spaces {
		if !sp.home && len(sp.subs) == 0 && now.Sub(sp.usedAt) > hubIdle {
			delete(h.spaces, ns)
			forgotten = append(forgotten, sp.rec)
			continue
		}
		if len(sp.subs) > 0 || sp.prev == nil || now.Sub(sp.prev.at) >= h.interval {
			due = append(due, sp)
		}
	}
	h.mu.Unlock()
	stopRecorders(forgotten)
	for _, sp := range due {
		ctx, cancel := context.WithTimeout(h.ctx, hubReadTimeout)
		v, err := h.read(ctx, sp.ns)
		cancel()
		select {
		case <-h.stop:
			return
		default:
		}
		if err != nil {
			h.s.cfg.Logger.Debug("dashboard hub: read failed", "namespace", sp.ns, "err", err)
			continue
		}
		h.apply(sp, v, time.Now())
	}
}

// read reads namespace ns: its queues, then the fingerprints of the other
// topics in one transaction.
func (h *hub) read(ctx context.Context, ns string) (*view, error) {
	ctx = context.WithValue(ctx, nsKey, ns)
	qs, err := h.s.queueSummaries(ctx)
	if err != nil {
		return nil, err
	}
	keys := keyspace.MustNew(ns)
	var names []string
	var ops []clientv3.Op
	for topic, prefixes := range topicPrefixes {
		for _, p := range prefixes(keys) {
			names = append(names, topic)
			ops = append(ops, clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
				clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(1)))
		}
	}
	resp, err := h.s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	v := &view{queues: qs, prints: map[string][2]int64{}}
	for i, r := range resp.Responses {
		rr := r.GetResponseRange()
		p := v.prints[names[i]]
		p[0] += rr.Count
		if len(rr.Kvs) > 0 {
			p[1] = max(p[1], rr.Kvs[0].ModRevision)
		}
		v.prints[names[i]] = p
	}
	return v, nil
}

// apply records read v of sp: a sample when one is due, and the changes
// for sp's streams.
func (h *hub) apply(sp *space, v *view, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var t totals
	t.at = now
	for _, q := range v.queues {
		t.succeeded += q.Succeeded
		t.dead += q.Dead
	}
	var sample *StatsSample
	switch {
	case sp.prev == nil:
		sp.prev = &t
	case now.Sub(sp.prev.at) >= h.interval:
		s := sampleOf(*sp.prev, t, v.queues)
		sample = &s
		sp.samples.add(s, int(historyWindow/h.interval))
		sp.prev = &t
	}
	var topics []string
	queuesChanged := sp.last == nil || !slices.Equal(sp.last.queues, v.queues)
	if sp.last != nil {
		for topic, p := range v.prints {
			if sp.last.prints[topic] != p {
				topics = append(topics, topic)
			}
		}
		slices.Sort(topics)
	}
	sp.last = v
	if sp.home {
		h.exportDepth(v.queues)
	}
	for sub := range sp.subs {
		sub.post(v.queues, queuesChanged, topics, sample)
	}
}

// exportDepth sets the drover_queue_tasks and drover_queue_paused gauges
// from a read of the server's own namespace (h.mu held): the queues'
// counts by state and whether they are paused, as `drover worker` sets
// them for its queue (neither gauge has a namespace label, so the
// server's per-namespace queue Clients do not set them), so that an
// operator watching the server sees every queue's depth. The read is the
// one the stats history samples: the gauges cost no read of their own. A
// queue gone since the last read loses its gauges.
func (h *hub) exportDepth(qs []QueueSummary) {
	seen := make(map[string]bool, len(qs))
	for _, q := range qs {
		seen[q.Name] = true
		for state, n := range q.stats.ByState() {
			metrics.QueueTasks.WithLabelValues(q.Name, state).Set(float64(n))
		}
		metrics.QueuePaused.WithLabelValues(q.Name).Set(map[bool]float64{true: 1}[q.Paused])
	}
	for name := range h.exported {
		if !seen[name] {
			metrics.QueueTasks.DeletePartialMatch(prometheus.Labels{"queue": name})
			metrics.QueuePaused.DeleteLabelValues(name)
		}
	}
	h.exported = seen
}

// sampleOf is the sample between counts a and b, with the queues' counts
// at b.
func sampleOf(a, b totals, qs []QueueSummary) StatsSample {
	secs := b.at.Sub(a.at).Seconds()
	rate := func(from, to int64) float64 {
		if to <= from || secs <= 0 {
			return 0 // a purge or a requeue lowered the count: no negative rate
		}
		return float64(to-from) / secs
	}
	s := StatsSample{At: b.at.UTC(), Processed: rate(a.succeeded, b.succeeded), Failed: rate(a.dead, b.dead), Queues: len(qs)}
	for _, q := range qs {
		s.Pending += q.Pending
		s.Running += q.Running
		s.Retrying += q.Retrying
		s.Succeeded += q.Succeeded
		s.Dead += q.Dead
	}
	return s
}

// spaceLocked returns the space of ns, made if new (h.mu held); nil when
// the hub follows as many namespaces as it may.
func (h *hub) spaceLocked(ns string) *space {
	sp := h.spaces[ns]
	if sp == nil {
		if len(h.spaces) >= hubSpacesMax && ns != h.s.cfg.Namespace {
			return nil
		}
		sp = &space{ns: ns, subs: map[*subscriber]struct{}{}}
		sp.rec = h.newRecorder(ns)
		h.spaces[ns] = sp
	}
	sp.usedAt = time.Now()
	return sp
}

// history returns ns's samples, oldest first, and whether the hub follows
// ns (it starts following it now if it can).
func (h *hub) history(ns string) ([]StatsSample, bool) {
	h.start()
	h.mu.Lock()
	defer h.mu.Unlock()
	sp := h.spaceLocked(ns)
	if sp == nil {
		return nil, false
	}
	return sp.samples.list(), true
}

// follow follows ns (its queue history is kept from now on, for an hour
// after the last request that names it), if the hub may.
func (h *hub) follow(ns string) {
	h.start()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.spaceLocked(ns)
}

// subscribe follows ns for a stream until cancel; nil when the hub
// follows as many namespaces as it may.
func (h *hub) subscribe(ns string) (sub *subscriber, cancel func()) {
	h.start()
	h.mu.Lock()
	defer h.mu.Unlock()
	sp := h.spaceLocked(ns)
	if sp == nil {
		return nil, func() {}
	}
	sub = &subscriber{wake: make(chan struct{}, 1)}
	sp.subs[sub] = struct{}{}
	if sp.last != nil {
		// The stream's snapshot was read before it subscribed: a round of
		// the hub in between saw counts the stream has not, and posts
		// nothing unless they change again. Start it with them.
		sub.post(sp.last.queues, true, nil, nil)
	}
	return sub, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(sp.subs, sub)
		sp.usedAt = time.Now()
	}
}

// subscriber is one stream's mailbox: the hub posts what changed, merged
// with what the stream has not taken yet, and never blocks on it.
type subscriber struct {
	wake chan struct{}

	mu      sync.Mutex
	queues  []QueueSummary // the latest counts, when they changed
	topics  []string
	samples []StatsSample
}

func (sub *subscriber) post(qs []QueueSummary, queuesChanged bool, topics []string, sample *StatsSample) {
	if !queuesChanged && len(topics) == 0 && sample == nil {
		return
	}
	sub.mu.Lock()
	if queuesChanged {
		sub.queues = qs
	}
	for _, t := range topics {
		if !slices.Contains(sub.topics, t) {
			sub.topics = append(sub.topics, t)
		}
	}
	if sample != nil {
		sub.samples = append(sub.samples, *sample)
		if len(sub.samples) > subSamplesMax {
			sub.samples = sub.samples[len(sub.samples)-subSamplesMax:]
		}
	}
	sub.mu.Unlock()
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

// take returns and clears what was posted.
func (sub *subscriber) take() (qs []QueueSummary, topics []string, samples []StatsSample) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	qs, topics, samples = sub.queues, sub.topics, sub.samples
	sub.queues, sub.topics, sub.samples = nil, nil, nil
	slices.Sort(topics)
	return qs, topics, samples
}

// ring keeps the last samples, up to a bound.
type ring struct {
	buf  []StatsSample
	next int
}

func (r *ring) add(s StatsSample, size int) {
	size = max(size, 1)
	if len(r.buf) < size {
		r.buf = append(r.buf, s)
		return
	}
	r.buf[r.next%len(r.buf)] = s
	r.next = (r.next + 1) % len(r.buf)
}

// list returns the samples, oldest first.
func (r *ring) list() []StatsSample {
	out := make([]StatsSample, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}
