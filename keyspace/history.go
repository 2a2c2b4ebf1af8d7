package keyspace

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A queue's history is one small record per queue per minute in which
// something happened, under /{ns}/queue-history/q/{q}/{minute}, and one
// mark, /{ns}/queue-history/mark, that says which minute was closed last
// and through which revision of the store its counts go. Both live
// outside the queues' prefix, so that workers watching a queue's keys are
// not woken by them.

// QueueHistory is the prefix of the namespace's queue history, ending in
// "/".
func (s Space) QueueHistory() string { return s.root + "queue-history/" }

// QueueHistoryMark is the key of the history's mark: the last minute
// closed and the revision its counts go through.
func (s Space) QueueHistoryMark() string { return s.QueueHistory() + "mark" }

// QueueHistoryMinutes is the prefix of queue q's minute records, ending
// in "/"; they sort by time.
func (s Space) QueueHistoryMinutes(q string) string { return s.QueueHistory() + "q/" + q + "/" }

// QueueHistoryMinute is the key of queue q's record of the minute that
// starts at m (its name: the minute's Unix seconds, 12 digits).
func (s Space) QueueHistoryMinute(q string, m time.Time) string {
	return fmt.Sprintf("%s%012d", s.QueueHistoryMinutes(q), m.Unix())
}

// ParseQueueHistoryMinute reads a minute record's key: its queue and the
// minute's start; false when key is not one.
func (s Space) ParseQueueHistoryMinute(key string) (q string, m time.Time, ok bool) {
	rest, ok := strings.CutPrefix(key, s.QueueHistory()+"q/")
	if !ok {
		return "", time.Time{}, false
	}
	q, name, ok := strings.Cut(rest, "/")
	if !ok || q == "" || len(name) != 12 {
		return "", time.Time{}, false
	}
	secs, err := strconv.ParseInt(name, 10, 64)
	if err != nil {
		return "", time.Time{}, false
	}
	return q, time.Unix(secs, 0).UTC(), true
}

// ParseQueueKey splits a key under the namespace's queues into its queue,
// the kind of key ("outs", "runs", "retry", "dead", "done", ...: the
// folder below the queue) and what follows the kind's "/"; false when key
// is not under a queue's prefix or has no kind.
func (s Space) ParseQueueKey(key string) (q, kind, rest string, ok bool) {
	r, ok := strings.CutPrefix(key, s.root+"queues/")
	if !ok {
		return "", "", "", false
	}
	q, r, ok = strings.Cut(r, "/")
	if !ok || q == "" {
		return "", "", "", false
	}
	kind, rest, _ = strings.Cut(r, "/")
	return q, kind, rest, kind != ""
}

// QueueWatchEnd is the end of the key range from [Space.QueueHistory]
// that holds the queue history and every queue's keys (the queue
// directory between them): one watch of [QueueHistory, QueueWatchEnd)
// sees both.
func (s Space) QueueWatchEnd() string { return s.root + "queues0" }
