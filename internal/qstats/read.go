package qstats

import (
	"context"
	"fmt"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The windows a history covers.
const (
	Hour = time.Hour
	Day  = 24 * time.Hour
)

// Minute is one minute of a queue's history.
type Minute struct {
	At time.Time // the minute's start
	Counts
	// Depth is the queue's depth at the minute's end: from the minute's
	// record, or carried from the record before (a record is written when
	// the depth changed, something was counted, or at least hourly while
	// the depth is not zero; one written by a server that did not know
	// the depth yet carries it too).
	Depth
	Latency Latency
	// Closed: a server closed the minute (its counts are final); false for
	// the minutes after the mark.
	Closed bool
	// Gap: the counts may be short (see the package doc).
	Gap bool
}

// History is a queue's history over a window, a minute at a time.
type History struct {
	Queue   string
	Window  time.Duration
	Minutes []Minute // oldest first, one per minute of the window
	Total   Counts
	Latency Latency // every minute's samples
	// ClosedThrough is the start of the last minute closed, zero when no
	// server has closed one.
	ClosedThrough time.Time
}

// CheckWindow returns a drover.InputError naming field unless w is one of
// the windows a history covers: an hour or a day.
func CheckWindow(field string, w time.Duration) error {
	if w != Hour && w != Day {
		return &drover.InputError{Field: field, Value: w.String(), Rule: "must be 1h or 24h"}
	}
	return nil
}

// before is how many records before a window Read reads to find the
// depth the window starts with: the last one whose depth is known.
const before = 8

// Read returns queue q's history over window (Hour or Day) ending with the
// minute of now, in one read: the window's records, the record before it
// (the depth it starts with) and the mark.
func Read(ctx context.Context, cli *clientv3.Client, ns, q string, window time.Duration, now time.Time) (*History, error) {
	if err := CheckWindow("window", window); err != nil {
		return nil, err
	}
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	if err := keyspace.CheckName("queue", q); err != nil {
		return nil, err
	}
	end := now.UTC().Truncate(time.Minute).Add(time.Minute)
	start := end.Add(-window)
	from, to := keys.QueueHistoryMinute(q, start), keys.QueueHistoryMinute(q, end)
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpGet(from, clientv3.WithRange(to)),
		clientv3.OpGet(keys.QueueHistoryMinutes(q), clientv3.WithRange(from), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(before)),
		clientv3.OpGet(keys.QueueHistoryMark()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("qstats: read the history of queue %s: %w", q, err)
	}
	h := &History{Queue: q, Window: window, Latency: Latency{}}
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) > 0 {
		if m, err := decodeMark(kvs[0].Value); err == nil && m.Minute > 0 {
			h.ClosedThrough = time.Unix(m.Minute, 0).UTC()
		}
	}
	recs := map[int64]record{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if _, m, ok := keys.ParseQueueHistoryMinute(string(kv.Key)); ok {
			if rec, err := decodeRecord(kv.Value); err == nil {
				recs[m.Unix()] = rec
			}
		}
	}
	var depth Depth
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if rec, err := decodeRecord(kv.Value); err == nil && !rec.Unknown {
			depth = rec.Depth
			break
		}
	}
	for at := start; at.Before(end); at = at.Add(time.Minute) {
		mi := Minute{At: at, Depth: depth, Closed: !h.ClosedThrough.IsZero() && !at.After(h.ClosedThrough), Latency: Latency{}}
		if rec, ok := recs[at.Unix()]; ok {
			mi.Counts, mi.Gap, mi.Latency = rec.Counts, rec.Gap, latencyOf(rec.Latency)
			if !rec.Unknown {
				mi.Depth, depth = rec.Depth, rec.Depth
			}
		}
		h.Total.add(mi.Counts)
		h.Latency.add(mi.Latency)
		h.Minutes = append(h.Minutes, mi)
	}
	return h, nil
}
