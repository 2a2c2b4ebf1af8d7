package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// segmentStatus reports whether tasks in status st can be in segments:
// scheduled, pending, running and succeeded ones. Tasks retrying, dead or cancelled
// have records of their own.
func segmentStatus(st Status) bool {
	return st == Pending || st == Running || st == Succeeded || st == Scheduled
}

// slotCursor is a place in a listing of segment tasks: "{seg}/{slot:03d}".
func slotCursor(seg string, slot int) string { return fmt.Sprintf("%s/%03d", seg, slot) }

func parseSlotCursor(after string) (seg string, slot int) {
	seg, s, ok := strings.Cut(after, "/")
	if !ok {
		return after, -1
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return seg, -1
	}
	return seg, n
}

// listSegments lists up to limit tasks of queue q in status st that are in
// segments, after cursor after, in segment and slot order. It returns the
// cursor of the next page ("" at the end).
func (c *Client) listSegments(ctx context.Context, q string, st Status, after string, limit int) ([]*Task, string, error) {
	seg0, slot0 := parseSlotCursor(after)
	var out []*Task
	for from := seg0; ; {
		segs, more, err := c.segmentsWith(ctx, q, st, from)
		if err != nil {
			return nil, "", err
		}
		for _, seg := range segs {
			next, err := c.listSegment(ctx, q, st, seg, seg0, slot0, limit, &out)
			if err != nil || next != "" {
				return out, next, err
			}
		}
		if !more || len(segs) == 0 {
			return out, "", nil
		}
		// Past every key of the last segment ('0' follows '/'; names
		// are of one length, so no other segment starts with this one).
		from = segs[len(segs)-1] + "0"
	}
}

// segmentsWith returns the segments from segment from on that may hold
// tasks in status st, and whether there are more.
func (c *Client) segmentsWith(ctx context.Context, q string, st Status, from string) ([]string, bool, error) {
	switch st {
	case Scheduled:
		return c.dueSegments(ctx, q, from)
	case Pending:
		return c.segmentNames(ctx, c.keys.SegmentsOpen(q), from, false)
	case Succeeded:
		return c.segmentNames(ctx, c.keys.Outs(q, ""), from, true)
	default:
		return c.segmentNames(ctx, c.keys.Runs(q, ""), from, true)
	}
}

// listSegment appends to out the tasks of segment seg in status st after
// slot slot0 of segment seg0, up to limit; it returns the next page's
// cursor when the page filled before the segment's end.
func (c *Client) listSegment(ctx context.Context, q string, st Status, seg, seg0 string, slot0, limit int, out *[]*Task) (string, error) {
	state, err := c.readState(ctx, q, seg)
	if err != nil {
		return "", err
	}
	ts, err := c.segmentTasks(ctx, q, seg)
	if err != nil || state.vanished() {
		return "", err // a vanished one was gathered: its tasks are in another
	}
	if !state.open && state.n == 0 {
		state.n = len(ts)
	}
	for slot := range ts {
		if seg == seg0 && slot <= slot0 {
			continue
		}
		t, _ := taskOf(ts, slot)
		if !state.fill(t, slot) || t.CurrentStatus != st {
			continue
		}
		t.seg = &segRef{queue: q, seg: seg, slot: slot, rev: state.rev}
		if len(*out) == limit {
			last := (*out)[len(*out)-1].seg
			return slotCursor(last.seg, last.slot), nil
		}
		*out = append(*out, t)
	}
	return "", nil
}

// segmentNames returns the segments named by the keys under prefix from
// segment from on, in order: the keys are the segments' own (open
// segments) or, with nested, keys below a segment's name (runs, outcomes).
// It reads at most a few thousand keys, and says whether there are more.
func (c *Client) segmentNames(ctx context.Context, prefix, from string, nested bool) ([]string, bool, error) {
	g, err := c.cli.Get(ctx, prefix+from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithKeysOnly(), clientv3.WithLimit(4096))
	if err != nil {
		return nil, false, fmt.Errorf("queue: read segments: %w", err)
	}
	var out []string
	for _, kv := range g.Kvs {
		var seg string
		if nested {
			seg, _, _ = keyspace.SegmentPart(prefix, string(kv.Key))
		} else {
			seg, _ = keyspace.Last(prefix, string(kv.Key))
		}
		if seg != "" && (len(out) == 0 || out[len(out)-1] != seg) {
			out = append(out, seg)
		}
	}
	return out, g.More, nil
}

// dueSegments returns queue q's segments in the due index from segment
// from on, in due order, and whether there are more. A segment's due key
// follows from its name, so from (a name) gives where to start.
func (c *Client) dueSegments(ctx context.Context, q, from string) ([]string, bool, error) {
	pre := c.keys.QueueDue(q)
	start := pre
	if from != "" {
		start = c.keys.SegmentDue(q, from)
	}
	g, err := c.cli.Get(ctx, start, clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithKeysOnly(), clientv3.WithLimit(4096))
	if err != nil {
		return nil, false, fmt.Errorf("queue: read scheduled segments: %w", err)
	}
	out := make([]string, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		if seg, _, _ := c.parseDue(q, string(kv.Key)); seg != "" {
			out = append(out, seg)
		}
	}
	return out, g.More, nil
}

// segmentStatsOps are the reads segmentStats counts from: keys only
// (counts are in their names, a scheduled segment's too), except the open and closed segments' small
// values and the live runs' (their slots).
func (c *Client) segmentStatsOps(q string) []clientv3.Op {
	keysOnly := func(p string) clientv3.Op {
		return clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	}
	return []clientv3.Op{
		clientv3.OpGet(c.keys.SegmentsOpen(q), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.Runs(q, ""), clientv3.WithPrefix()), keysOnly(c.keys.Outs(q, "")), keysOnly(c.keys.Exits(q, "")),
		clientv3.OpGet(c.keys.SegmentsClosed(q), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.QueueDueVersion(q), clientv3.WithKeysOnly()),
	}
}

// dueRead is the read of queue q's due index keys (their names count
// their tasks) that follows segmentStatsOps when the index changed.
func (c *Client) dueRead(q string) clientv3.Op {
	return clientv3.OpGet(c.keys.QueueDue(q), clientv3.WithPrefix(), clientv3.WithKeysOnly())
}

// segmentStats counts queue q's tasks in segments, pending (with the
// scheduled ones), running and succeeded, from the responses of
// segmentStatsOps. Only cancels and purges touch a scheduled segment: its
// exits are counted as an open segment's are.
func (c *Client) segmentStats(ctx context.Context, q string, unchanged bool, rs []*pb.ResponseOp) (scheduled, pending, running, succeeded int64, err error) {
	open := map[string]bool{}
	for _, kv := range rs[0].GetResponseRange().Kvs {
		seg, _ := keyspace.Last(c.keys.SegmentsOpen(q), string(kv.Key))
		n, _ := strconv.ParseInt(string(kv.Value), 10, 64)
		open[seg] = true
		pending += n
	}
	sched, err := c.dueStats(ctx, q, unchanged, rs[5:], &scheduled)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	inOpen := func(k int, pre string, count func(rest string) (int64, int64)) (a, b int64) {
		for _, kv := range rs[k].GetResponseRange().Kvs {
			seg, rest, ok := keyspace.SegmentPart(pre, string(kv.Key))
			if ok && (open[seg] || sched[seg]) {
				x, y := count(rest)
				a, b = a+x, b+y
			}
		}
		return a, b
	}
	live := map[int64]bool{} // live runs' tokens: their tasks with outcomes do not run any more
	for _, kv := range rs[1].GetResponseRange().Kvs {
		live[kv.CreateRevision] = true
	}
	running, _ = inOpen(1, c.keys.Runs(q, ""), func(rest string) (int64, int64) { return int64(keyspace.RunSlots(rest)), 0 })
	var ended int64
	ok, moved := inOpen(2, c.keys.Outs(q, ""), func(rest string) (int64, int64) {
		token, o, m, _ := keyspace.ParseOutName(rest)
		if live[token] {
			ended += int64(o + m)
		}
		return int64(o), int64(m)
	})
	running -= ended
	// An exit is a slot that left unfinished (not pending any more; if its
	// run still lives, not running either: cancelled while it ran), or a
	// purged success ("-ok": not succeeded any more).
	held := map[string]bool{} // "{segment}/{slot}" of the live runs
	for _, kv := range rs[1].GetResponseRange().Kvs {
		seg, _, _ := keyspace.SegmentPart(c.keys.Runs(q, ""), string(kv.Key))
		if v, err := taskstore.DecodeRun(kv.Value); err == nil {
			for _, s := range v.Slots {
				held[fmt.Sprintf("%s/%d", seg, s)] = true
			}
		}
	}
	var exits, purgedOK int64
	for _, kv := range rs[3].GetResponseRange().Kvs {
		seg, rest, ok := keyspace.SegmentPart(c.keys.Exits(q, ""), string(kv.Key))
		if !ok || !open[seg] && !sched[seg] {
			continue
		}
		slot, done, _ := keyspace.ParseExit(rest)
		if sched[seg] { // cancelled or purged while scheduled
			scheduled--
			continue
		}
		switch {
		case done:
			purgedOK++
		case held[fmt.Sprintf("%s/%d", seg, slot)]:
			running--
			exits++
		default:
			exits++
		}
	}
	for _, kv := range rs[4].GetResponseRange().Kvs {
		n, _ := strconv.ParseInt(string(kv.Value), 10, 64)
		succeeded += n
	}
	return scheduled, pending - running - ok - moved - exits, running, succeeded + ok - purgedOK, nil
}

// dueCount is what a Stats read of a queue's due index: the mod revision
// of its version key then, when, the tasks and the segments.
type dueCount struct {
	ver  int64
	at   time.Time
	n    int64
	segs map[string]bool
}

// dueCountFor bounds how long a count of the due index is used without
// reading the index again: a process of an earlier release moves segments
// without putting the version key.
const dueCountFor = time.Minute

// dueUnchanged is the compare that holds while queue q's due index is as
// the last Stats read it (never, when none did or long ago).
func (c *Client) dueUnchanged(q string) clientv3.Cmp {
	ver := int64(-1)
	if v, ok := c.dueCounts.Load(q); ok && time.Since(v.(*dueCount).at) < dueCountFor {
		ver = v.(*dueCount).ver
	}
	return clientv3.Compare(clientv3.ModRevision(c.keys.QueueDueVersion(q)), "=", ver)
}

// dueStats adds the tasks of queue q's due index to *n and returns its
// segments: as the last Stats read them when unchanged (rs[0] is the
// version key), else from rs[1], the index's keys (a key written before
// due keys carried their count in their name is read again for its
// value).
func (c *Client) dueStats(ctx context.Context, q string, unchanged bool, rs []*pb.ResponseOp, n *int64) (map[string]bool, error) {
	if v, ok := c.dueCounts.Load(q); ok && unchanged {
		*n += v.(*dueCount).n
		return v.(*dueCount).segs, nil
	}
	sched := map[string]bool{}
	var old []clientv3.Op
	var k int64
	for _, kv := range rs[1].GetResponseRange().Kvs {
		seg, m, counted := c.parseDue(q, string(kv.Key))
		if seg == "" {
			continue
		}
		sched[seg] = true
		if counted {
			k += int64(m)
		} else {
			old = append(old, clientv3.OpGet(string(kv.Key)))
		}
	}
	for len(old) > 0 {
		part := old[:min(len(old), 100)]
		old = old[len(part):]
		resp, err := c.cli.Txn(ctx).Then(part...).Commit()
		if err != nil {
			return nil, fmt.Errorf("queue: read scheduled segments of %s: %w", q, err)
		}
		for _, rr := range resp.Responses {
			for _, kv := range rr.GetResponseRange().Kvs {
				m, _ := strconv.ParseInt(string(kv.Value), 10, 64)
				k += m
			}
		}
	}
	*n += k
	if ver := rs[0].GetResponseRange().Kvs; len(ver) > 0 {
		c.dueCounts.Store(q, &dueCount{ver: ver[0].ModRevision, at: time.Now(), n: k, segs: sched})
	} else {
		c.dueCounts.Delete(q)
	}
	return sched, nil
}

// dueKey is segment seg's key in queue q's due index, with its n tasks
// in its name ("{due}-{seg}-{n}"), so that a read of the keys alone counts
// the scheduled tasks.
func (c *Client) dueKey(q, seg string, n int) string {
	return c.keys.SegmentDue(q, seg) + "-" + strconv.Itoa(n)
}

// parseDue reads key, a key of queue q's due index: its segment and its
// number of tasks; counted is false for a key written before the count
// was in the name ("{due}-{seg}"), whose value holds it; seg is "" for a
// key that is neither.
func (c *Client) parseDue(q, key string) (seg string, n int, counted bool) {
	_, name, ok := keyspace.ParseTimedKey(c.keys.QueueDue(q), key)
	if !ok {
		return "", 0, false
	}
	if _, _, ok := keyspace.ParseSegmentName(name); ok && !strings.Contains(name[25:], "-") {
		return name, 0, false
	}
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return "", 0, false
	}
	k, err := strconv.Atoi(name[i+1:])
	if _, _, ok := keyspace.ParseSegmentName(name[:i]); !ok || err != nil || k < 0 {
		return "", 0, false
	}
	return name[:i], k, true
}

// scheduledMark starts the random part of the name of a segment submitted
// to run later (never a hex digit), so that its tasks' history says
// SCHEDULED once it fell due and its due key is gone.
const scheduledMark = "s"

// submittedHistory is the history of a task of segment seg, submitted at
// created, up to when it became claimable: PENDING at created, or, for a
// segment submitted to run later, SCHEDULED at created and PENDING at its
// due time. (Segments scheduled before the mark existed show PENDING.)
func submittedHistory(seg string, created time.Time) []Transition {
	_, due, ok := keyspace.ParseSegmentName(seg)
	if !ok || !strings.HasPrefix(seg[25:], scheduledMark) {
		return []Transition{{Status: Pending, At: created}}
	}
	return []Transition{{Status: Scheduled, At: created}, {Status: Pending, At: due.UTC()}}
}

// drained reports whether queue q has nothing left for a draining worker:
// no task pending, running or retrying, and none scheduled, sleeping or
// waiting that is due by now (a moment from moving to pending: a wait
// whose timeout passed). A drain does not wait for the tasks scheduled,
// sleeping or waiting after it: they stay SCHEDULED, SLEEPING or WAITING
// for the workers that run then.
//
// The due indexes are read before the counts: a task moves from one to
// pending only, so one that moves between the two reads is counted
// pending (read the other way round, it could be seen in neither).
func (c *Client) drained(ctx context.Context, q string) bool {
	var ops []clientv3.Op
	for _, pre := range []string{c.keys.QueueDue(q), c.keys.QueueSleep(q), c.keys.QueueWait(q)} {
		ops = append(ops, clientv3.OpGet(pre, clientv3.WithRange(keyspace.TimeBound(pre, c.now().UnixNano()+1)), clientv3.WithKeysOnly(), clientv3.WithLimit(1)))
	}
	g, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return false
	}
	for _, r := range g.Responses {
		if len(r.GetResponseRange().Kvs) != 0 {
			return false
		}
	}
	st, err := c.Stats(ctx, q)
	return err == nil && st.Unfinished()-st.Scheduled-st.Sleeping-st.Waiting == 0
}

// RunNow makes scheduled tasks of queue q due now (a requeue of a
// SCHEDULED task): ids, or every scheduled task when ids is empty. Each
// leaves its segment (an exit, as a cancel writes) for a record of its own
// that is PENDING at once, its history SCHEDULED then PENDING; its
// neighbours in the segment keep their time. It returns how many it
// moved; progress, if set, is called after each transaction with the
// number handled so far.
func (c *Client) RunNow(ctx context.Context, q string, ids []string, progress func(done int)) (int, error) {
	return c.bulk(ctx, q, Scheduled, ids, progress, func(t *Task) ([]clientv3.Op, int, string) {
		now := c.now().UTC()
		t.CurrentStatus, t.ScheduledAt, t.Attempt, t.Token = Pending, time.Time{}, 0, 0
		t.Transitions = append(t.Transitions, Transition{Status: Pending, At: now, Error: "requeued: due now"})
		rec, _ := json.Marshal(t)
		return []clientv3.Op{
			clientv3.OpPut(c.keys.TaskRecord(t.ID), string(rec)),
			clientv3.OpPut(c.keys.Exit(q, t.seg.seg, t.seg.slot), "requeued"),
			clientv3.OpPut(c.pendingKey(t), encodePending(0, false)),
		}, len(rec), c.levelKey(q, levelOf(t.Metadata.Priority))
	})
}

// A due bucket's tasks are gathered into full segments when they move.
// Tasks submitted together but due over a spread of times fall due in
// segments of a few tasks (10,000 a request over a minute: about 3 in
// each 20 ms), and every segment costs its claims, runs, outcomes and
// close whatever it holds. So the move of a batch of due segments
// (scheduledIndex) rewrites the small ones of each priority level, in
// due order, into new segments of up to SegmentSize, opened at once, and
// points their tasks' index keys at their new places, in the move's one
// transaction: every source's due key as read and no exit in it (no task
// left it: a cancel, a requeue, a purge), and the sources' records
// deleted. A retry after a crash or a lost race finds the sources moved,
// or moves them anew: a task is in one segment at any time.

// gatherBelow is the size under which a due segment is gathered with
// others at its move; larger ones are opened as they are.
const gatherBelow = SegmentSize / 2

// gatherBytes bounds what one gathered move writes (the compressed
// records, index keys and names: gatherCost), within etcd's request
// size; the rest of the batch opens as it is.
const gatherBytes = 512 << 10

// dueSource is a due segment a move reads: the key's segment, its level,
// due time and count, and its tasks when they are gathered.
type dueSource struct {
	seg   string
	level int
	due   time.Time
	n     int
	tasks []Task // nil: opened as it is
}

// gatherDue is scheduledIndex's Gather: the compares and writes that move
// the due segments kvs of queue q together, their small ones gathered
// into full segments; nil writes when there is nothing to gather (the
// index then moves them one by one). One read takes the records of the
// small ones and, per priority level, the exits of the segments named
// from the first of them to the last: one that has an exit (a task left
// it) opens as it is, and the move requires that no exit was put there
// since (one compare per level, not one per segment: etcd allows 128 in
// a request, and the due keys take 64).
func (c *Client) gatherDue(ctx context.Context, q string, kvs []*mvccpb.KeyValue) ([]clientv3.Cmp, []clientv3.Op, error) {
	srcs, small, levels := c.dueSources(q, kvs)
	if len(small) < 2 {
		return nil, nil, nil
	}
	gets := make([]clientv3.Op, 0, len(small)+len(levels))
	for _, i := range small {
		gets = append(gets, clientv3.OpGet(c.keys.Segment(q, srcs[i].seg)))
	}
	exits := c.keys.Exits(q, "")
	lvs := slices.Sorted(maps.Keys(levels)) // one order for the reads and their answers
	for _, lv := range lvs {
		r := levels[lv]
		gets = append(gets, clientv3.OpGet(c.keys.Exits(q, r[0]), clientv3.WithRange(clientv3.GetPrefixRangeEnd(c.keys.Exits(q, r[1]))),
			clientv3.WithKeysOnly(), clientv3.WithLimit(gatherExitsRead)))
	}
	resp, err := c.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("queue: read the due segments of %s: %w", q, err)
	}
	if testHookGatherRead != nil {
		testHookGatherRead()
	}
	left := map[string]bool{} // segments with an exit
	unread := map[int]bool{}  // levels whose exits were not read whole
	var cmps []clientv3.Cmp
	k := len(small)
	for _, lv := range lvs {
		r := levels[lv]
		rr := resp.Responses[k].GetResponseRange()
		k++
		if rr.More {
			unread[lv] = true
			continue
		}
		for _, kv := range rr.Kvs {
			if seg, _, ok := keyspace.SegmentPart(exits, string(kv.Key)); ok {
				left[seg] = true
			}
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.keys.Exits(q, r[0])).WithRange(clientv3.GetPrefixRangeEnd(c.keys.Exits(q, r[1]))), "<", resp.Header.Revision+1))
	}
	gathered, size := 0, 0
	for k, i := range small {
		rec := resp.Responses[k].GetResponseRange().Kvs
		if len(rec) == 0 || left[srcs[i].seg] || unread[srcs[i].level] || size+len(rec[0].Value) > gatherBytes {
			continue
		}
		ts, err := decodeSegment(rec[0].Value)
		if err != nil || len(ts) != srcs[i].n {
			continue // opened as it is: its claims say what is wrong
		}
		cost := c.gatherCost(q, srcs[i].seg, len(rec[0].Value), ts)
		if size+cost > gatherBytes {
			continue
		}
		size += cost
		srcs[i].tasks = ts
		gathered++
	}
	if gathered < 2 {
		return nil, nil, nil
	}
	absent, ops, err := c.gatherWrites(q, srcs)
	return append(cmps, absent...), ops, err
}

// gatherCost estimates the bytes a gathered move writes for source seg of
// queue q, its record of n bytes holding ts: its share of a new record,
// its tasks' index keys and values, and its deleted record's and due
// key's names.
func (c *Client) gatherCost(q, seg string, n int, ts []Task) int {
	cost := n + 2*len(c.keys.Segment(q, seg))
	place := len(keyspace.TaskPlace{Queue: q, Segment: seg, Slot: SegmentSize}.String()) + len(scheduledMark) + 15
	for i := range ts {
		cost += len(c.keys.TaskIndex(ts[i].ID)) + place
	}
	return cost
}

// testHookGatherRead, set by tests only, runs after gatherDue's read:
// what others write between the read and the move.
var testHookGatherRead func()

// gatherExitsRead bounds the exits one gathered move reads per level: a
// level with more opens its segments as they are (a variable: tests
// lower it).
var gatherExitsRead int64 = 1000

// dueSources reads the due keys kvs of queue q: the sources, the indexes
// of the small ones (with others of their level to gather with), and per
// level the first and last of their names.
func (c *Client) dueSources(q string, kvs []*mvccpb.KeyValue) (srcs []dueSource, small []int, levels map[int][2]string) {
	srcs = make([]dueSource, len(kvs))
	perLevel := map[int]int{}
	for i, kv := range kvs {
		seg, n, counted := c.parseDue(q, string(kv.Key))
		if seg == "" {
			return nil, nil, nil // not a segment's key: the plain move drops it
		}
		if !counted {
			n, _ = strconv.Atoi(string(kv.Value))
		}
		lv, at, _ := keyspace.ParseSegmentName(seg)
		srcs[i] = dueSource{seg: seg, level: lv, due: at, n: n}
		if n > 0 && n < gatherBelow {
			perLevel[lv]++
		}
	}
	levels = map[int][2]string{}
	for i, s := range srcs {
		if s.n <= 0 || s.n >= gatherBelow || perLevel[s.level] < 2 {
			continue
		}
		small = append(small, i)
		r, ok := levels[s.level]
		if !ok {
			r = [2]string{s.seg, s.seg}
		}
		levels[s.level] = [2]string{min(r[0], s.seg), max(r[1], s.seg)}
	}
	return srcs, small, levels
}
