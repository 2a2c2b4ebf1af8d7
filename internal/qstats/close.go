package qstats

import (
	"context"
	"encoding/json"
	"errors"
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
	recs := r.collectLocked()
	through, markMod := r.through, r.markMod
	r.mu.Unlock()
	ok, err := r.write(ctx, m, recs, through, markMod)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		r.mu.Lock()
		r.lease = 0
		r.mu.Unlock()
		ok, err = r.write(ctx, m, recs, through, markMod)
	}
	if err != nil || !ok {
		return false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for q, rec := range recs {
		r.written[q] = rec.Depth
	}
	return true, nil
}

// collectLocked sums the deltas by queue into the minute's records, with
// each queue's depth: a queue gets a record when it counted something or
// its depth changed since its last record.
func (r *Recorder) collectLocked() map[string]record {
	sums := map[string]*record{}
	lats := map[string]Latency{}
	get := func(q string) *record {
		if sums[q] == nil {
			sums[q] = &record{Depth: r.written[q]}
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
	var depth map[string]Depth
	if r.cfg.Depth != nil {
		depth = r.cfg.Depth()
	}
	if depth != nil {
		for q := range r.written {
			if _, ok := depth[q]; !ok && r.written[q] != (Depth{}) {
				get(q).Depth = Depth{} // gone, or counted empty
			}
		}
		for q, d := range depth {
			if d != r.written[q] || sums[q] != nil {
				get(q).Depth = d
			}
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
		out[q] = *rec
	}
	return out
}

// write commits the records and the new mark; false when the mark moved.
// More records than one transaction takes go in several, each refused
// when its first record exists already (another recorder wrote it).
func (r *Recorder) write(ctx context.Context, m time.Time, recs map[string]record, through, markMod int64) (bool, error) {
	lease, err := r.leaseFor(ctx)
	if err != nil {
		return false, err
	}
	names := make([]string, 0, len(recs))
	for q := range recs {
		names = append(names, q)
	}
	sort.Strings(names)
	markKey := r.keys.QueueHistoryMark()
	mv, _ := json.Marshal(mark{Minute: m.Unix(), Rev: through})
	for {
		n := min(len(names), maxTxnOps-1)
		final := n == len(names)
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(markKey), "=", markMod)}
		var ops []clientv3.Op
		for _, q := range names[:n] {
			ops = append(ops, clientv3.OpPut(r.keys.QueueHistoryMinute(q, m), string(recs[q].encode()), clientv3.WithLease(lease)))
		}
		if final {
			ops = append(ops, clientv3.OpPut(markKey, string(mv)))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(r.keys.QueueHistoryMinute(names[0], m)), "=", 0))
		}
		resp, err := r.cfg.Client.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil || !resp.Succeeded {
			return false, err
		}
		if final {
			r.mu.Lock()
			r.setMarkLocked(mv, resp.Header.Revision)
			r.mu.Unlock()
			return true, nil
		}
		names = names[n:]
	}
}

// leaseFor returns the lease new records are bound to: one granted for
// Retention and an hour, used for an hour, so that records live between
// a day and a day and an hour.
func (r *Recorder) leaseFor(ctx context.Context) (clientv3.LeaseID, error) {
	r.mu.Lock()
	if r.lease != 0 && time.Since(r.leaseAt) < time.Hour {
		defer r.mu.Unlock()
		return r.lease, nil
	}
	r.mu.Unlock()
	g, err := r.cfg.Client.Grant(ctx, int64((Retention + time.Hour).Seconds()))
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lease, r.leaseAt = g.ID, time.Now()
	return g.ID, nil
}
