package keyspace

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Pending is a queued task's place in its queue's pending index:
// /{ns}/queues/{q}/pending/{shard:03d}/{level:04d}{submitted:019d}-{id}.
// Keys sort by shard, then level (lower first: a level is 1000 minus the
// priority), then submission time.
type Pending struct {
	Shard     int
	Level     int
	Submitted time.Time
	ID        string
}

// QueueShard is the prefix of shard i of queue q's pending index, ending in
// "/".
func (s Space) QueueShard(q string, i int) string {
	return fmt.Sprintf("%s%03d/", s.QueuePending(q), i)
}

// PendingKey is p's key in queue q's pending index.
func (s Space) PendingKey(q string, p Pending) string {
	return fmt.Sprintf("%s%s%019d-%s", s.QueueShard(q, p.Shard), LevelName(p.Level), p.Submitted.UnixNano(), p.ID)
}

// ParsePendingKey reads a key of queue q's pending index; false when key is
// not one.
func (s Space) ParsePendingKey(q, key string) (Pending, bool) {
	return ParsePending(s.QueuePending(q), key)
}

// ParsePending reads a key of the pending index whose prefix (a queue's
// [Space.QueuePending]) is given; false when key is not one.
func ParsePending(prefix, key string) (Pending, bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	// "{shard:03d}/{level:04d}{submitted:019d}-{id}"
	if !ok || len(rest) < 3+1+4+19+2 || rest[3] != '/' || rest[27] != '-' {
		return Pending{}, false
	}
	shard, err1 := strconv.Atoi(rest[:3])
	level, err2 := strconv.Atoi(rest[4:8])
	ns, err3 := strconv.ParseInt(rest[8:27], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return Pending{}, false
	}
	return Pending{Shard: shard, Level: level, Submitted: time.Unix(0, ns), ID: rest[28:]}, true
}

// PendingOrder is the part of a pending key that orders tasks within a
// level across shards: level, then submission time, then id.
func (s Space) PendingOrder(q, key string) string {
	rest := strings.TrimPrefix(key, s.QueuePending(q))
	if len(rest) < 4 {
		return rest
	}
	return rest[4:]
}

// LevelName is the name of priority level level, as pending keys and level
// markers hold it.
func LevelName(level int) string { return fmt.Sprintf("%04d", level) }

// QueueLevel is the marker of priority level lv in queue q.
func (s Space) QueueLevel(q, lv string) string { return s.QueueLevels(q) + lv }

// QueueRetryKey is task id's key in queue q's retry schedule, due at due.
func (s Space) QueueRetryKey(q string, due time.Time, id string) string {
	return TimedKey(s.QueueRetry(q), due.UnixNano(), id)
}

// QueueDoneKey is task id's key in queue q's index of finished tasks of
// status st, finished at at.
func (s Space) QueueDoneKey(q, st string, at time.Time, id string) string {
	return TimedKey(s.QueueDone(q, st), at.UnixNano(), id)
}

// TimedKey is the key of id under prefix, ordered by time t (Unix
// nanoseconds): "{prefix}{t:019d}-{id}". The retry schedule and the done
// indexes are made of such keys.
func TimedKey(prefix string, t int64, id string) string {
	return fmt.Sprintf("%s%019d-%s", prefix, t, id)
}

// TimeBound is the first key under prefix of time t: a range that ends there
// holds the timed keys before t.
func TimeBound(prefix string, t int64) string { return fmt.Sprintf("%s%019d", prefix, t) }

// ParseTimedKey reads a timed key under prefix; false when key is not one.
func ParseTimedKey(prefix, key string) (t int64, id string, ok bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || len(rest) < 21 || rest[19] != '-' {
		return 0, "", false
	}
	t, err := strconv.ParseInt(rest[:19], 10, 64)
	if err != nil {
		return 0, "", false
	}
	return t, rest[20:], true
}

// Last returns the segment of key after prefix, and false when key is not
// under prefix or the rest has more segments.
func Last(prefix, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return "", false
	}
	return rest, true
}

// Rest is what follows prefix in key: a listing's cursor.
func Rest(prefix, key string) string { return strings.TrimPrefix(key, prefix) }
