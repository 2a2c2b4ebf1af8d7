package qstats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/droverhq/drover/internal/lifecycle"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Retention is how long minute records are kept at least: they are bound
// to a lease of Retention and two hours, granted up to an hour before.
const Retention = 24 * time.Hour

// The closing of minutes: a server closes a minute from closeDelay after
// it ends (so that the minute's last events reach its watch), or from
// gapGrace after when it has not seen every event since the last mark
// (another server that has goes first), and for two more looks at most;
// it looks every closeEvery.
const (
	closeDelay = 2 * time.Second
	gapGrace   = 15 * time.Second
	closeEvery = 5 * time.Second
	// depthEvery: a queue whose depth is not zero gets a record at least
	// this often, changed or not, so that the record a reader carries the
	// depth from has not gone with its lease (see leaseFor).
	depthEvery = time.Hour
	// staleMark: a server that starts more than this after the end of the
	// last minute closed starts counting from its start (a gap), rather
	// than putting everything since in one minute.
	staleMark = 5 * time.Minute
	// skewTolerance: a server warns when another closed a minute more
	// than this early by its clock. A server's clock ahead by d closes
	// each minute d early, so the minute takes in d of the next one's
	// events; the servers' clocks are assumed synchronized (NTP).
	skewTolerance = 2 * time.Second
	// maxTxnOps is etcd's default limit of operations in a transaction
	// (embed.DefaultMaxTxnOps, which the embedded server keeps).
	maxTxnOps = 128
)

// Config configures a Recorder.
type Config struct {
	Client    *clientv3.Client
	Namespace string // "" means keyspace.DefaultNamespace
	// Depth returns every queue's depth as last counted (the server's
	// dashboard hub counts them every few seconds); a minute's record
	// keeps it. Nil, or a nil map: depth unknown, the last one is kept.
	Depth func() map[string]Depth
	// Now is the clock that says which minute has ended (time.Now by
	// default).
	Now func() time.Time
	// Manual: minutes are closed only by CloseMinute, never on the clock.
	Manual bool
	// Metrics: export the counts as the drover_queue_* metrics, from the
	// events written after the recorder started.
	Metrics bool
	Logger  *slog.Logger
}

// Recorder counts a namespace's queue events and closes minutes. Start
// and Stop it once; safe to stop twice or before start.
type Recorder struct {
	cfg   Config
	keys  keyspace.Space
	lc    lifecycle.Lifecycle
	ready chan struct{}
	once  sync.Once

	mu sync.Mutex
	// deltas are the counts of events after the mark's revision, in
	// revision order.
	deltas []delta
	// through: every event up to this revision was received; from: the
	// first revision the recorder's watches covered since it started
	// (later than the mark's revision + 1 after a compaction: a gap).
	through, from int64
	// observeFrom: events from this revision on go to the metrics.
	observeFrom int64
	mk          mark
	markMod     int64
	// written is each queue's depth in its last minute record seen, with
	// that record's minute, for the queues whose depth is not zero (a
	// queue absent is empty, or unknown after a start).
	written map[string]lastDepth
	lease   clientv3.LeaseID
	leaseAt time.Time
}

// lastDepth is a queue's depth in its last record, and that record's
// minute (Unix seconds).
type lastDepth struct {
	Depth
	minute int64
}

// delta is one event's counts.
type delta struct {
	rev     int64
	q       string
	c       Counts
	lat     int           // the latency's bucket, when c.Started > 0
	latency time.Duration // the latency itself, for the metrics
}

// NewRecorder returns a recorder for cfg; Start starts it.
func NewRecorder(cfg Config) (*Recorder, error) {
	if cfg.Client == nil {
		return nil, errors.New("qstats: Config.Client is nil")
	}
	keys, err := keyspace.New(cfg.Namespace)
	if err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Recorder{cfg: cfg, keys: keys, ready: make(chan struct{}), written: map[string]lastDepth{}}, nil
}

// Start starts following the namespace's queues.
func (r *Recorder) Start(ctx context.Context) { r.lc.Start(ctx, r.run) }

// Stop stops it and waits, bounded by ctx. Counts not closed into a
// minute yet are not lost: the next recorder to start reads them again
// from the mark's revision.
func (r *Recorder) Stop(ctx context.Context) error { return r.lc.Stop(ctx) }

// Unclosed is what the recorder counted for queue q and not closed into
// a minute yet.
func (r *Recorder) Unclosed(q string) Counts {
	r.mu.Lock()
	defer r.mu.Unlock()
	var c Counts
	for _, d := range r.deltas {
		if d.q == q {
			c.add(d.c)
		}
	}
	return c
}

// Ready is closed once the recorder has read the mark and watches.
func (r *Recorder) Ready() <-chan struct{} { return r.ready }

func (r *Recorder) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Debug("queue history: watch ended; following again", "err", err)
		_ = lifecycle.Sleep(ctx, time.Second)
	}
}

// follow reads the mark the first time, then watches from the first
// revision not received yet, closing minutes as they end.
func (r *Recorder) follow(ctx context.Context) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	r.once.Do(func() { close(r.ready) })
	r.mu.Lock()
	from := r.through + 1
	r.mu.Unlock()
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := r.cfg.Client.Watch(wctx, r.keys.QueueHistory(), watchOptions(r.keys, from)...)
	var tick <-chan time.Time
	if !r.cfg.Manual {
		t := time.NewTicker(closeEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case wr, ok := <-wch:
			if !ok {
				return errors.New("watch closed")
			}
			if wr.CompactRevision > 0 {
				r.compacted(wr.CompactRevision)
				return fmt.Errorf("revisions before %d compacted", wr.CompactRevision)
			}
			if err := wr.Err(); err != nil {
				return err
			}
			r.take(wr)
		case <-tick:
			r.closeDue(ctx)
		}
	}
}

// watchOptions are the options of the recorder's watch of the queue
// history's keys and the queues' keys, from revision from. The watch
// needs values (runs, retries, minute records and the mark are decoded),
// so it cannot be keys-only (etcd has no such watch), but no deletion is
// counted: the store leaves them out before they are sent, about a third
// of a queue's events. The mark's own deletion is found when a close's
// compare fails (see markGone).
func watchOptions(keys keyspace.Space, from int64) []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithRange(keys.QueueWatchEnd()), clientv3.WithRev(from),
		clientv3.WithProgressNotify(), clientv3.WithFilterDelete()}
}

// begin reads the mark when the recorder has not yet: its watch starts
// after the mark's revision, so that the events not closed into a minute
// yet (a restart) are counted again.
func (r *Recorder) begin(ctx context.Context) error {
	r.mu.Lock()
	started := r.from > 0
	r.mu.Unlock()
	if started {
		return nil
	}
	resp, err := r.cfg.Client.Get(ctx, r.keys.QueueHistoryMark())
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.from = resp.Header.Revision + 1
	r.observeFrom = resp.Header.Revision + 1
	r.mk.Rev = resp.Header.Revision // no mark: the history starts now, no gap
	if len(resp.Kvs) > 0 {
		r.setMarkLocked(resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
		r.from = r.mk.Rev + 1
		// A mark closed long ago (no server ran): what was written since
		// would all go into one minute. The history starts now instead,
		// and its first minute says gap.
		if ended := time.Unix(r.mk.Minute, 0).Add(time.Minute); r.cfg.Now().Sub(ended) > staleMark {
			r.cfg.Logger.Warn("queue history: the last minute closed ended long ago; what happened since is not counted",
				"closed", ended.Add(-time.Minute).UTC(), "since", r.cfg.Now().Sub(ended).Round(time.Second))
			r.from = resp.Header.Revision + 1
		}
	}
	r.through = r.from - 1
	return nil
}

// compacted: the events before rev are gone; the watch starts again at
// rev, and a minute closed next says it may miss some.
func (r *Recorder) compacted(rev int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.through < rev-1 {
		r.cfg.Logger.Warn("queue history: events were compacted before they were counted; the next minute may count short", "from", r.through+1, "to", rev-1)
		r.through = rev - 1
		r.from = max(r.from, rev)
	}
}

func (r *Recorder) setMarkLocked(v []byte, mod int64) {
	m, err := decodeMark(v)
	if err != nil || m.Minute < r.mk.Minute {
		return
	}
	r.mk, r.markMod = m, mod
	i := 0
	for i < len(r.deltas) && r.deltas[i].rev <= m.Rev {
		i++
	}
	r.deltas = slices.Delete(r.deltas, 0, i)
	if cap(r.deltas) > spanEvents && len(r.deltas) < cap(r.deltas)/4 {
		r.deltas = slices.Clone(r.deltas) // a burst's memory goes with it
	}
}
