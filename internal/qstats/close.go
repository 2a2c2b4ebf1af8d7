package qstats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func decodeMark(b []byte) (mark, error) {
	var m mark
	err := json.Unmarshal(b, &m)
	return m, err
}

// closeDue closes the minute that ended last, once it is due.
func (r *Recorder) closeDue(ctx context.Context) {
	now := r.cfg.Now()
	m := now.Truncate(time.Minute).Add(-time.Minute)
	r.mu.Lock()
	gap := r.from > r.mk.Rev+1
	closed := m.Unix() <= r.mk.Minute
	r.mu.Unlock()
	// A minute is closed soon after it ends or not at all: closed later,
	// it would take in the events of the next minute under its name (a
	// server that just started, say). Its events then go to the next.
	ended, from := now.Sub(m.Add(time.Minute)), closeDelay
	if gap {
		from = gapGrace
	}
	if closed || ended < from || ended > from+2*closeEvery {
		return
	}
	if _, err := r.CloseMinute(ctx, m); err != nil {
		r.cfg.Logger.Debug("queue history: could not close a minute", "minute", m, "err", err)
	}
}

// CloseMinute writes the records of the minute that starts at m (made a
// whole minute) with the counts received since the mark, and moves the
// mark, in one transaction that compares the mark: closed is false when
// another recorder moved it first (its records stand), when m is not
// after the mark's minute, or when this recorder has not yet received the
// events the mark counts.
func (r *Recorder) CloseMinute(ctx context.Context, m time.Time) (closed bool, err error) {
	m = m.UTC().Truncate(time.Minute)
	r.mu.Lock()
	if m.Unix() <= r.mk.Minute || r.through < r.mk.Rev {
		r.mu.Unlock()
		return false, nil
	}
	recs := r.collectLocked(m)
	through, markMod := r.through, r.markMod
	r.mu.Unlock()
	ok, err := r.write(ctx, m, recs, through, markMod)
	if !ok {
		return false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for q, rec := range recs {
		if !rec.Unknown {
			r.noteDepthLocked(q, rec.Depth, m.Unix())
		}
	}
	return true, err
}

// collectLocked sums the deltas by queue into minute m's records, with
// each queue's depth: a queue gets a record when it counted something,
// its depth changed since its last record, or its depth is not zero and
// its last record is depthEvery old.
func (r *Recorder) collectLocked(m time.Time) map[string]record {
	sums := map[string]*record{}
	lats := map[string]Latency{}
	get := func(q string) *record {
		if sums[q] == nil {
			w, ok := r.written[q]
			sums[q] = &record{Depth: w.Depth, Unknown: !ok} // absent: empty or, after a start, unknown
			lats[q] = Latency{}
		}
		return sums[q]
	}
	for _, d := range r.deltas {
		rec := get(d.q)
		rec.Counts.add(d.c)
		if d.c.Started > 0 {
			lats[d.q][d.lat] += d.c.Started
		}
	}
	for q, w := range r.written {
		if m.Unix()-w.minute >= int64(depthEvery.Seconds()) {
			get(q)
		}
	}
	var depth map[string]Depth
	if r.cfg.Depth != nil {
		depth = r.cfg.Depth()
	}
	if depth != nil {
		for q, w := range r.written {
			if _, ok := depth[q]; !ok && w.Depth != (Depth{}) {
				get(q) // gone, or counted empty
			}
		}
		for q, d := range depth {
			if d != r.written[q].Depth {
				get(q)
			}
		}
		for q, rec := range sums { // the depth read is the truth for every queue
			rec.Depth, rec.Unknown = depth[q], false
		}
	}
	gap := r.from > r.mk.Rev+1
	if gap { // every queue known says so, counted or not
		for q := range r.written {
			get(q)
		}
		for q := range depth {
			get(q)
		}
	}
	out := make(map[string]record, len(sums))
	for q, rec := range sums {
		rec.Latency = lats[q].stored()
		rec.Gap = gap
		if rec.Unknown {
			rec.Depth = Depth{}
		}
		out[q] = *rec
	}
	return out
}

// noteDepthLocked keeps queue q's depth d, read in its record of minute
// m, unless a later record's is kept; only depths not zero are kept.
func (r *Recorder) noteDepthLocked(q string, d Depth, m int64) {
	if w, ok := r.written[q]; ok && w.minute > m {
		return
	}
	if d == (Depth{}) {
		delete(r.written, q)
		return
	}
	r.written[q] = lastDepth{Depth: d, minute: m}
}

// write claims the minute and writes its records: the first transaction
// moves the mark, compared with the version this recorder read, and holds
// as many records as a transaction takes; so two recorders never both
// close a minute, and a failed first transaction writes nothing. The
// records one transaction cannot take (more than maxTxnOps-1 queues) go
// in more, each compared with the mark this recorder wrote: once the
// mark moves on (the next minute was closed) they are dropped. A failure
// after the claim (retried twice per transaction) loses those records:
// closed is true and err says how many; an event is never counted twice.
func (r *Recorder) write(ctx context.Context, m time.Time, recs map[string]record, through, markMod int64) (bool, error) {
	names := make([]string, 0, len(recs))
	for q := range recs {
		names = append(names, q)
	}
	sort.Strings(names)
	markKey := r.keys.QueueHistoryMark()
	mv, _ := json.Marshal(mark{Minute: m.Unix(), Rev: through, At: r.cfg.Now().UnixMilli()})
	n := min(len(names), maxTxnOps-1)
	rev, err := r.commit(ctx, m, recs, names[:n], clientv3.Compare(clientv3.ModRevision(markKey), "=", markMod), clientv3.OpPut(markKey, string(mv)))
	if err == nil && rev == 0 {
		err = r.markGone(ctx, markMod)
	}
	if err != nil || rev == 0 {
		return false, err
	}
	r.mu.Lock()
	r.setMarkLocked(mv, rev)
	r.mu.Unlock()
	fence := clientv3.Compare(clientv3.ModRevision(markKey), "=", rev)
	for names = names[n:]; len(names) > 0; names = names[n:] {
		n = min(len(names), maxTxnOps)
		for try := 0; ; try++ {
			var got int64
			got, err = r.commit(ctx, m, recs, names[:n], fence)
			if err == nil && got == 0 {
				err = errors.New("the next minute was closed first")
				break
			}
			if err == nil || try == 2 || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			return true, fmt.Errorf("qstats: minute %s closed without the records of %d queues: %w", m.Format(time.RFC3339), len(names), err)
		}
	}
	return true, nil
}

// markGone is called when the mark was not at markMod: most often another
// recorder moved it (the watch brings the new one), but it may have been
// deleted (by hand, or with the namespace's keys), which the watch does
// not say. Then the next close creates it again.
func (r *Recorder) markGone(ctx context.Context, markMod int64) error {
	resp, err := r.cfg.Client.Get(ctx, r.keys.QueueHistoryMark(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	if resp.Count == 0 {
		r.mu.Lock()
		if r.markMod == markMod {
			r.markMod = 0
		}
		r.mu.Unlock()
	}
	return nil
}

// commit writes the records of queues names with ops, if cmp holds: the
// revision it committed at, 0 when cmp failed.
func (r *Recorder) commit(ctx context.Context, m time.Time, recs map[string]record, names []string, cmp clientv3.Cmp, ops ...clientv3.Op) (int64, error) {
	for retried := false; ; retried = true {
		lease, err := r.leaseFor(ctx)
		if err != nil {
			return 0, err
		}
		all := slices.Clone(ops)
		for _, q := range names {
			all = append(all, clientv3.OpPut(r.keys.QueueHistoryMinute(q, m), string(recs[q].encode()), clientv3.WithLease(lease)))
		}
		resp, err := r.cfg.Client.Txn(ctx).If(cmp).Then(all...).Commit()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) && !retried {
			r.mu.Lock()
			r.lease = 0
			r.mu.Unlock()
			continue
		}
		if err != nil || !resp.Succeeded {
			return 0, err
		}
		return resp.Header.Revision, nil
	}
}

// leaseFor returns the lease new records are bound to: one granted for
// Retention and two hours, used for an hour, so that records live between
// a day and an hour and a day and two hours: a day's window can carry the
// depth from the record before its start (at most depthEvery before).
func (r *Recorder) leaseFor(ctx context.Context) (clientv3.LeaseID, error) {
	r.mu.Lock()
	if r.lease != 0 && time.Since(r.leaseAt) < time.Hour {
		defer r.mu.Unlock()
		return r.lease, nil
	}
	r.mu.Unlock()
	g, err := r.cfg.Client.Grant(ctx, int64((Retention + 2*time.Hour).Seconds()))
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lease, r.leaseAt = g.ID, time.Now()
	return g.ID, nil
}
