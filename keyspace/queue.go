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
	t, ok = ParseTimeBound(prefix, key)
	rest := key[min(len(key), len(prefix)+19):]
	if !ok || len(rest) < 2 || rest[0] != '-' {
		return 0, "", false
	}
	return t, rest[1:], true
}

// ParseTimeBound reads the time of a key under prefix that begins with
// one, a timed key or a TimeBound; false when key does not.
func ParseTimeBound(prefix, key string) (t int64, ok bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || len(rest) < 19 {
		return 0, false
	}
	t, err := strconv.ParseInt(rest[:19], 10, 64)
	return t, err == nil
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

// A segment holds the records of up to a hundred tasks of one queue and one
// priority level, submitted together, in one key. A segment's name,
// "{level:04d}-{submitted:019d}-{rand}", sorts by level (higher priority
// first), then submission time. Its state lives beside it in small keys: the
// runs claimed on it (lease-bound), their durable twins (the attempts
// started), the outcomes written in batches, and the slots that left it.

// SegmentName names a segment of priority level level, submitted at at;
// suffix keeps names of one instant apart.
func SegmentName(level int, at time.Time, suffix string) string {
	return fmt.Sprintf("%s-%019d-%s", LevelName(level), at.UnixNano(), suffix)
}

// SegmentLevel returns the priority level of segment name; false when name
// is not a segment name.
func SegmentLevel(name string) (int, bool) {
	lv, _, ok := ParseSegmentName(name)
	return lv, ok
}

// ParseSegmentName returns the priority level and submission time of
// segment name; false when name is not a segment name.
func ParseSegmentName(name string) (level int, at time.Time, ok bool) {
	if len(name) < 4+1+19+2 || name[4] != '-' || name[24] != '-' {
		return 0, time.Time{}, false
	}
	lv, err1 := strconv.Atoi(name[:4])
	ns, err2 := strconv.ParseInt(name[5:24], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, time.Time{}, false
	}
	return lv, time.Unix(0, ns), true
}

// SegmentBound is the first key under prefix (a queue's SegmentsOpen) of
// the segments of level level submitted at or after at: a range that ends
// there holds the open segments before it.
func SegmentBound(prefix string, level int, at time.Time) string {
	return fmt.Sprintf("%s%s-%019d", prefix, LevelName(level), at.UnixNano())
}

// RunName is a run's (and its try's) key below its segment's prefix in
// [Space.Runs] and [Space.Tries]: "{n:03d}-{id}-{seq}", the number of slots
// first, so that counting needs no values.
func RunName(n int, id string, seq int64) string { return fmt.Sprintf("%03d-%s-%d", n, id, seq) }

// RunSlots reads the number of slots of a run's name (see [RunName]).
func RunSlots(name string) int {
	if len(name) < 3 {
		return 0
	}
	n, _ := strconv.Atoi(name[:3])
	return n
}

// OutName is an outcome batch's key below its segment's prefix in
// [Space.Outs]: "{token:019d}-{ok:03d}-{moved:03d}-{seq}". The run's token
// first, so that a claim can require that no run made after its read left
// outcomes (a range compare from [OutsFrom] on).
func OutName(token int64, ok, moved int, seq int64) string {
	return fmt.Sprintf("%019d-%03d-%03d-%d", token, ok, moved, seq)
}

// ParseOutName reads what [OutName] wrote; false when name is not one.
func ParseOutName(name string) (token int64, ok, moved int, valid bool) {
	parts := strings.SplitN(name, "-", 4)
	if len(parts) < 4 {
		return 0, 0, 0, false
	}
	token, err1 := strconv.ParseInt(parts[0], 10, 64)
	ok, err2 := strconv.Atoi(parts[1])
	moved, err3 := strconv.Atoi(parts[2])
	return token, ok, moved, err1 == nil && err2 == nil && err3 == nil
}

// OutsFrom is the first outcome key of segment seg of queue q written by a
// run made at or after revision rev.
func (s Space) OutsFrom(q, seg string, rev int64) string {
	return fmt.Sprintf("%s%019d", s.Outs(q, seg), rev)
}

// ParseExit reads an exit's name below its segment's prefix in
// [Space.Exits]: its slot, and whether the slot had succeeded (an
// [Space.ExitDone] key); false when name is not one.
func ParseExit(name string) (slot int, done, ok bool) {
	if len(name) < 3 {
		return 0, false, false
	}
	slot, err := strconv.Atoi(name[:3])
	rest := name[3:]
	return slot, rest == "-ok", err == nil && (rest == "" || rest == "-ok")
}

// TaskIndex is the key that makes task id's submission idempotent and says
// where the task is: its queue, segment and slot.
func (s Space) TaskIndex(id string) string { return s.root + "ids/" + id }

// Segments is the prefix of queue q's segment records, ending in "/". It is
// outside the queue's prefix so that watchers of the queue's small keys are
// not sent the records.
func (s Space) Segments(q string) string { return s.root + "segments/" + q + "/" }

// Segment is the key of segment seg of queue q: its tasks' records.
func (s Space) Segment(q, seg string) string { return s.Segments(q) + seg }

// SegmentsOpen is the prefix of queue q's open segments (with tasks not yet
// finished), ending in "/"; the value of each is its number of tasks.
func (s Space) SegmentsOpen(q string) string { return s.Queue(q) + "open/" }

// SegmentOpen is segment seg's key in queue q's open segments.
func (s Space) SegmentOpen(q, seg string) string { return s.SegmentsOpen(q) + seg }

// QueueDue is the prefix of queue q's due index, ending in "/": one key per
// segment whose tasks run later, "{due:019d}-{seg}-{n}" (see package
// internal/due), n and its value its number of tasks (keys written before
// the count was in the name are "{due:019d}-{seg}"). When the segment
// falls due the key moves to the open segments.
func (s Space) QueueDue(q string) string { return s.Queue(q) + "due/" }

// QueueDueVersion is the key every change of queue q's due index puts
// (a submission of scheduled segments, a move) or deletes (a purge), so
// that a reader can tell the index unchanged from its mod revision.
func (s Space) QueueDueVersion(q string) string { return s.Queue(q) + "duever" }

// QueueDueTurns is the prefix of the turns of queue q's due index's
// movers, ending in "/": a key per batch being moved, named after the
// batch's first due key without QueueDue, its value the mover's id, bound
// to a lease of the mover's own that lives a few seconds (package
// internal/due, Index.Turns).
func (s Space) QueueDueTurns(q string) string { return s.Queue(q) + "dueturns/" }

// SegmentDue is segment seg's key in queue q's due index without its
// count, a prefix of the key with it. A segment that
// runs later is named after its due time (SegmentName), so its name says
// where its key is; a segment submitted to run now has none.
func (s Space) SegmentDue(q, seg string) string {
	_, at, _ := ParseSegmentName(seg)
	return TimedKey(s.QueueDue(q), at.UnixNano(), seg)
}

// SegmentsQuarantined is the prefix of queue q's quarantined segments,
// ending in "/": segments whose value could not be decoded, taken out of
// the open segments so that claims go on. Each key's value says what and
// why; the segment's own key is left as it was.
func (s Space) SegmentsQuarantined(q string) string { return s.Queue(q) + "quarantine/" }

// SegmentQuarantined is segment seg's key in queue q's quarantined
// segments.
func (s Space) SegmentQuarantined(q, seg string) string { return s.SegmentsQuarantined(q) + seg }

// SegmentsClosed is the prefix of queue q's closed segments, ending in "/":
// keys "{closed:019d}-{seg}" whose value counts the tasks that succeeded in
// them.
func (s Space) SegmentsClosed(q string) string { return s.Queue(q) + "closed/" }

// SegmentClosed is segment seg's key in queue q's closed segments.
func (s Space) SegmentClosed(q, seg string, at time.Time) string {
	return TimedKey(s.SegmentsClosed(q), at.UnixNano(), seg)
}

// Runs is the prefix of queue q's runs (claims of slots of a segment, bound
// to the worker's lease), ending in "/"; with seg, of that segment's.
func (s Space) Runs(q, seg string) string { return segPart(s.Queue(q)+"runs/", seg) }

// Tries is the prefix of queue q's tries (a run's durable twin: the
// attempts it started), ending in "/"; with seg, of that segment's.
func (s Space) Tries(q, seg string) string { return segPart(s.Queue(q)+"tries/", seg) }

// Outs is the prefix of queue q's outcome batches, ending in "/"; with seg,
// of that segment's.
func (s Space) Outs(q, seg string) string { return segPart(s.Queue(q)+"outs/", seg) }

// Exits is the prefix of queue q's exits (slots that left their segment
// while not running: cancelled or purged), ending in "/"; with seg, of that
// segment's.
func (s Space) Exits(q, seg string) string { return segPart(s.Queue(q)+"exits/", seg) }

// Exit is the key of slot slot of segment seg in queue q's exits.
func (s Space) Exit(q, seg string, slot int) string {
	return fmt.Sprintf("%s%03d", s.Exits(q, seg), slot)
}

// ExitDone is the key of slot slot of segment seg in queue q's exits when
// the slot had succeeded before it left (it was purged): a name of its own,
// so that counting keys tells it from a slot that left unfinished.
func (s Space) ExitDone(q, seg string, slot int) string { return s.Exit(q, seg, slot) + "-ok" }

// Run is the key of run name of segment seg in queue q.
func (s Space) Run(q, seg, name string) string { return s.Runs(q, seg) + name }

// RunNameOf is the name (RunName) of run or try key key of a segment;
// prefix is its s.Runs(q, seg) or s.Tries(q, seg), which callers reading
// many keys compute once.
func RunNameOf(prefix, key string) string { return strings.TrimPrefix(key, prefix) }

// Try is the key of the try (a run's durable twin) named name of segment
// seg in queue q.
func (s Space) Try(q, seg, name string) string { return s.Tries(q, seg) + name }

// Out is the key of outcome batch name (OutName) of segment seg in queue q.
func (s Space) Out(q, seg, name string) string { return s.Outs(q, seg) + name }

// RunOuts is the prefix of the outcome batches of segment seg in queue q
// that the run with token token wrote.
func (s Space) RunOuts(q, seg string, token int64) string {
	return fmt.Sprintf("%s%019d-", s.Outs(q, seg), token)
}

// ParseExitKey is ParseExit of exit key key of segment seg in queue q.
func (s Space) ParseExitKey(q, seg, key string) (slot int, done, ok bool) {
	name, found := strings.CutPrefix(key, s.Exits(q, seg))
	if !found {
		return 0, false, false
	}
	return ParseExit(name)
}

// OpenSegmentName is the segment that key, a key of a queue's open
// segments, names; ok is false for any other key. open is the queue's
// s.SegmentsOpen(q), which callers reading many keys compute once.
func OpenSegmentName(open, key string) (seg string, ok bool) {
	return strings.CutPrefix(key, open)
}

func segPart(pre, seg string) string {
	if seg == "" {
		return pre
	}
	return pre + seg + "/"
}

// SegmentPart splits a key under prefix (Runs, Tries, Outs or Exits of a
// queue, without segment) into its segment and the rest; false when key is
// not one.
func SegmentPart(prefix, key string) (seg, rest string, ok bool) {
	r, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return "", "", false
	}
	seg, rest, ok = strings.Cut(r, "/")
	return seg, rest, ok && seg != "" && rest != ""
}

// TaskPlace is where a task in a segment is: the value of its
// [Space.TaskIndex] key.
type TaskPlace struct {
	Queue, Segment string
	Slot           int
}

// String encodes p as its index key holds it: "{queue}/{segment}/{slot}".
func (p TaskPlace) String() string { return p.Queue + "/" + p.Segment + "/" + strconv.Itoa(p.Slot) }

// ParseTaskPlace reads an index key's value; false when v is not one.
func ParseTaskPlace(v string) (TaskPlace, bool) {
	parts := strings.Split(v, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return TaskPlace{}, false
	}
	slot, err := strconv.Atoi(parts[2])
	if err != nil || slot < 0 {
		return TaskPlace{}, false
	}
	return TaskPlace{Queue: parts[0], Segment: parts[1], Slot: slot}, true
}
