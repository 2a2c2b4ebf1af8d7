package queue

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover/internal/varcodec"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/tracing/otelspan"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
)

// testHookSegmentUnchanged, set by tests only, runs when a change that
// read a task in a segment makes its compares: what others write between
// the read and the change.
var testHookSegmentUnchanged func()

// segmentUnchanged are the compares that hold while t, a task in a segment,
// is as it was read in status st: its segment's record is there (a
// scheduled one's move may gather its tasks into another: gatherDue), the
// slot has not exited, the task has no record of its own, and, for a
// pending or running task, no run was made and no outcome written in its
// segment since (the caller reads again when another task's did).
func (c *Client) segmentUnchanged(t *Task, st Status) []clientv3.Cmp {
	if testHookSegmentUnchanged != nil {
		testHookSegmentUnchanged()
	}
	at := t.seg
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(c.keys.Segment(at.queue, at.seg)), ">", 0),
		clientv3.Compare(clientv3.CreateRevision(c.keys.Exit(at.queue, at.seg, at.slot)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(c.keys.ExitDone(at.queue, at.seg, at.slot)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(c.keys.TaskRecord(t.ID)), "=", 0),
	}
	if st == Pending || st == Running || st == Scheduled { // a scheduled one may fall due since
		cmps = append(cmps,
			clientv3.Compare(clientv3.ModRevision(c.keys.Runs(at.queue, at.seg)).WithPrefix(), "<", at.rev+1),
			clientv3.Compare(clientv3.ModRevision(c.keys.Outs(at.queue, at.seg)).WithPrefix(), "<", at.rev+1))
	}
	return cmps
}

// removeExpiredSegments removes queue q's segments closed before cutoff
// (Unix nanoseconds): the records, outcomes and exits, the index keys and
// step checkpoints of the tasks that succeeded in them, and the closed
// key, whose count moves to the queue's archived counts in the same
// transaction (unless archive is false: a purge). Tasks that left a
// segment keep their records. It only deletes, apart from the archived
// counts, so that a purge works while etcd refuses writes that grow it. It
// returns how many tasks it removed.
func (c *Client) removeExpiredSegments(ctx context.Context, q string, cutoff int64, archive bool) (int, error) {
	pre := c.keys.SegmentsClosed(q)
	removed := 0
	for {
		g, err := c.cli.Txn(ctx).Then(
			clientv3.OpGet(pre, clientv3.WithRange(keyspace.TimeBound(pre, cutoff)), clientv3.WithLimit(1)),
			clientv3.OpGet(c.keys.QueueArchived(q)),
		).Commit()
		if err != nil {
			return removed, fmt.Errorf("queue: remove expired segments of %s: %w", q, err)
		}
		kvs := g.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return removed, nil
		}
		closed := kvs[0]
		_, seg, _ := keyspace.ParseTimedKey(pre, string(closed.Key))
		var arch archived
		var archRev int64
		if a := g.Responses[1].GetResponseRange().Kvs; len(a) > 0 {
			_ = json.Unmarshal(a[0].Value, &arch)
			archRev = a[0].ModRevision
		}
		st, err := c.readState(ctx, q, seg)
		if err != nil {
			return removed, err
		}
		ts, err := c.segmentTasks(ctx, q, seg)
		if err != nil {
			return removed, err
		}
		var ids []string
		for slot := range ts {
			if _, ok := st.ok[slot]; ok && !st.exits[slot] {
				ids = append(ids, ts[slot].ID)
			}
		}
		// Step checkpoints first, a request at a time: harmless to
		// repeat, and too many for the request that removes the rest.
		for start := 0; start < len(ids); start += 100 {
			var ops []clientv3.Op
			for _, id := range ids[start:min(start+100, len(ids))] {
				ops = append(ops, clientv3.OpDelete(c.keys.Task(id), clientv3.WithPrefix()))
			}
			if _, err := c.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				return removed, fmt.Errorf("queue: remove expired segments of %s: %w", q, err)
			}
		}
		n, _ := strconv.ParseInt(string(closed.Value), 10, 64)
		ops := []clientv3.Op{
			clientv3.OpDelete(string(closed.Key)), clientv3.OpDelete(c.keys.Segment(q, seg)),
			clientv3.OpDelete(c.keys.Outs(q, seg), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.Exits(q, seg), clientv3.WithPrefix()),
		}
		if archive {
			arch.SegmentSucceeded += n
			b, _ := json.Marshal(arch)
			ops = append(ops, clientv3.OpPut(c.keys.QueueArchived(q), string(b)))
		}
		for _, id := range ids {
			ops = append(ops, clientv3.OpDelete(c.keys.TaskIndex(id)))
		}
		resp, err := c.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(string(closed.Key)), "=", closed.ModRevision),
			clientv3.Compare(clientv3.ModRevision(c.keys.QueueArchived(q)), "=", archRev),
		).Then(ops...).Commit()
		if err != nil {
			return removed, fmt.Errorf("queue: remove expired segments of %s: %w", q, err)
		}
		if resp.Succeeded {
			removed += int(n)
		}
	}
}

// purgePendingSegments removes, with deletes only, the open segments of
// queue q in which nothing runs and nothing succeeded: their records, keys
// and the index keys of their pending tasks (tasks that moved to records of
// their own keep theirs). What it leaves (segments with successes or runs)
// the caller purges task by task. It returns how many tasks it removed.
func (c *Client) purgePendingSegments(ctx context.Context, q string, progress func(int)) (int, error) {
	removed := 0
	from := c.keys.SegmentsOpen(q)
	end := clientv3.GetPrefixRangeEnd(from)
	for {
		g, err := c.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(openRead))
		if err != nil {
			return removed, fmt.Errorf("queue: purge %s: %w", q, err)
		}
		for _, kv := range g.Kvs {
			seg, _ := keyspace.Last(c.keys.SegmentsOpen(q), string(kv.Key))
			n, err := c.purgeSegment(ctx, q, seg)
			if err != nil {
				return removed, err
			}
			removed += n
			if progress != nil && n > 0 {
				progress(removed)
			}
		}
		if !g.More || len(g.Kvs) == 0 {
			return removed, nil
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}

// purgeSegment removes segment seg of queue q if nothing runs or succeeded
// in it, and returns how many pending tasks went with it.
func (c *Client) purgeSegment(ctx context.Context, q, seg string) (int, error) {
	st, err := c.readState(ctx, q, seg)
	if err != nil {
		return 0, err
	}
	if !st.open || len(st.runs) > 0 || len(st.ok) > 0 {
		return 0, nil
	}
	ts, err := c.segmentTasks(ctx, q, seg)
	if err != nil || ts == nil || st.holdsLiveChild(ts) {
		return 0, err // a live child's purge tells its parent: task by task
	}
	ops := []clientv3.Op{
		clientv3.OpDelete(c.keys.Segment(q, seg)), clientv3.OpDelete(c.keys.SegmentOpen(q, seg)),
		clientv3.OpDelete(c.keys.Tries(q, seg), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.Outs(q, seg), clientv3.WithPrefix()),
		clientv3.OpDelete(c.keys.Exits(q, seg), clientv3.WithPrefix()),
	}
	n := 0
	for slot := range ts {
		if !st.finished(slot) {
			ops = append(ops, clientv3.OpDelete(c.keys.TaskIndex(ts[slot].ID)), clientv3.OpDelete(c.keys.Task(ts[slot].ID), clientv3.WithPrefix()))
			n++
		}
	}
	if len(ops) > 120 { // two deletes a task: in two requests, the index keys last
		return c.purgeSegmentInTwo(ctx, q, st, ts, ops)
	}
	resp, err := c.cli.Txn(ctx).If(c.segmentIdle(q, st)...).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("queue: purge %s: %w", q, err)
	}
	if !resp.Succeeded {
		return 0, nil // claimed or changed since the read: purged task by task
	}
	return n, nil
}

// segmentIdle are the compares that hold while segment st is as read: open,
// no run, no outcome or exit since.
func (c *Client) segmentIdle(q string, st *segState) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(c.keys.SegmentOpen(q, st.name)), ">", 0),
		clientv3.Compare(clientv3.CreateRevision(c.keys.Runs(q, st.name)).WithPrefix(), "=", 0),
		clientv3.Compare(clientv3.ModRevision(c.keys.Outs(q, st.name)).WithPrefix(), "<", st.rev+1),
		clientv3.Compare(clientv3.ModRevision(c.keys.Exits(q, st.name)).WithPrefix(), "<", st.rev+1),
	}
}

// purgeSegmentInTwo is purgeSegment for a segment whose deletes do not fit
// one request: the segment and index keys under the compares, then the
// step checkpoints.
func (c *Client) purgeSegmentInTwo(ctx context.Context, q string, st *segState, ts []Task, ops []clientv3.Op) (int, error) {
	var first, rest []clientv3.Op
	for _, op := range ops {
		if op.IsDelete() && op.RangeBytes() != nil && strings.HasPrefix(string(op.KeyBytes()), c.keys.Tasks()) {
			first = append(first, op)
		} else {
			rest = append(rest, op)
		}
	}
	resp, err := c.cli.Txn(ctx).If(c.segmentIdle(q, st)...).Then(rest...).Commit()
	if err != nil {
		return 0, fmt.Errorf("queue: purge %s: %w", q, err)
	}
	if !resp.Succeeded {
		return 0, nil
	}
	// The tasks are gone: their step checkpoints go after them (never
	// before, or a claim in between would run tasks without theirs).
	if _, err := c.cli.Txn(ctx).Then(first...).Commit(); err != nil {
		return 0, fmt.Errorf("queue: purge %s: %w", q, err)
	}
	return len(rest) - 5, nil
}

// A segment's tasks are decoded by every worker that claims from it, once
// per segment, and encoded by every submission: as JSON that was the
// largest part of a worker's CPU after its claims (14 %). Before
// compression they are a binary form:
//
//	0x02 n task×n
//	task: 0x00 id type input output parameters createdAt priority source tenant maxRetries timeout backoffBase backoffMax
//	    | 0x01 the task as JSON (a task with any other field set, or a time not in UTC)
//	    | 0x02 as 0x00, then parent parentStep parentQueue (a child task: see task.Spawn)
//	    | 0x04|0x00 or 0x04|0x02: as without 0x04, then traceparent (the
//	      task's W3C trace context: the length 25, then trace id, span id
//	      and flags, 26 bytes in all)
//	    | 0x08|any of those: as without 0x08, then budget estimatedTokens
//	      (the task's metadata.budget and metadata.estimated_tokens)
//
// Strings and parameters are a uvarint length and the bytes; createdAt is
// 0 for the zero time, else 1, Unix seconds and nanoseconds; maxRetries is 0 for none
// and n+1 for n; numbers are varints (internal/varcodec's forms, read with
// its Reader). Parameters are stored
// compact and HTML-escaped, as encoding/json writes them, so a task reads
// back as it did when segments were JSON. A segment that starts with '['
// is read as a JSON array.
const segTasksV1 = 0x02

// segTasksBudget is segTasksV1 for a segment holding a task in a budget
// form (0x08): a build from before those forms takes this leading byte
// for a format it does not know and skips the segment (errSegmentFormat)
// where, reading 0x02, it would quarantine it.
const segTasksBudget = 0x03

const (
	taskBinary = 0x00
	taskJSON   = 0x01
	taskChild  = 0x02
	// taskTraced marks a binary form followed by the task's traceparent.
	taskTraced = 0x04
	// tracedLen is the length of a traced form's traceparent: trace id,
	// span id, flags.
	tracedLen = 25
	// taskBudget marks a binary form followed by the task's budget and
	// estimated tokens.
	taskBudget = 0x08
)

// encodeTasks returns the binary form of tasks.
func encodeTasks(tasks []Task) ([]byte, error) {
	n := 8
	for i := range tasks {
		n += recordSize(&tasks[i])
	}
	b := make([]byte, 0, n)
	b = append(b, segTasksV1)
	b = binary.AppendUvarint(b, uint64(len(tasks)))
	for i := range tasks {
		var err error
		mark := len(b)
		if b, err = appendTask(b, &tasks[i]); err != nil {
			return nil, fmt.Errorf("task %s: %w", tasks[i].ID, err)
		}
		if b[mark]&taskBudget != 0 {
			b[0] = segTasksBudget
		}
	}
	return b, nil
}

// appendTask appends t's form to b: binary when every field it sets has
// one, else JSON.
func appendTask(b []byte, t *Task) ([]byte, error) {
	params, ok := storedParameters(t.Parameters)
	sc, binForm := binaryTask(t)
	if !ok || !binForm {
		raw, err := json.Marshal(t)
		if err != nil {
			return nil, err
		}
		b = append(b, taskJSON)
		return varcodec.AppendBytes(b, raw), nil
	}
	form := byte(taskBinary)
	if t.Parent != "" || t.ParentStep != 0 || t.ParentQueue != "" {
		form = taskChild
	}
	mark := len(b)
	b = append(b, form)
	for _, s := range []string{t.ID, t.Type, t.InputDataURI, t.OutputDataURI} {
		b = varcodec.AppendBytes(b, []byte(s))
	}
	b = varcodec.AppendBytes(b, params)
	b = appendCreated(b, t.Metadata.CreatedAt)
	b = binary.AppendVarint(b, int64(t.Metadata.Priority))
	b = varcodec.AppendBytes(b, []byte(t.Metadata.SourceSystem))
	b = varcodec.AppendBytes(b, []byte(t.Metadata.Tenant))
	var retries int64
	if t.MaxRetries != nil {
		retries = int64(*t.MaxRetries) + 1
	}
	b = binary.AppendVarint(b, retries)
	for _, d := range []Duration{t.Timeout, t.BackoffBase, t.BackoffMax} {
		b = binary.AppendVarint(b, int64(d))
	}
	if form == taskChild {
		b = varcodec.AppendBytes(b, []byte(t.Parent))
		b = binary.AppendVarint(b, int64(t.ParentStep))
		b = varcodec.AppendBytes(b, []byte(t.ParentQueue))
	}
	if sc.IsValid() {
		b[mark] |= taskTraced
		tid, sid := sc.TraceID(), sc.SpanID()
		b = append(b, tracedLen) // varcodec.AppendBytes's uvarint length, in one byte
		b = append(append(append(b, tid[:]...), sid[:]...), byte(sc.TraceFlags()))
	}
	if m := &t.Metadata; m.Budget != "" || m.EstimatedTokens != 0 {
		b[mark] |= taskBudget
		b = varcodec.AppendBytes(b, []byte(m.Budget))
		b = binary.AppendVarint(b, m.EstimatedTokens)
	}
	return b, nil
}

// storedParameters is p as a JSON segment stored it (compact, HTML
// escaped); false when p is not valid JSON (json.Marshal then says so).
func storedParameters(p json.RawMessage) ([]byte, bool) {
	if len(p) == 0 {
		return nil, true
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, p); err != nil {
		return nil, false
	}
	if bytes.ContainsAny(buf.Bytes(), "<>&\u2028\u2029") {
		var esc bytes.Buffer
		json.HTMLEscape(&esc, buf.Bytes())
		return esc.Bytes(), true
	}
	return buf.Bytes(), true
}

// binaryTask reports whether the binary form holds all of t: no field
// outside it is set, a set MaxRetries is not negative, and createdAt is in
// UTC (JSON keeps another zone; the binary form reads back in UTC). sc is
// t's traceparent, parsed, when it is a valid one (the traced forms).
func binaryTask(t *Task) (sc trace.SpanContext, ok bool) {
	if at := t.Metadata.CreatedAt; !at.IsZero() && at.Location() != time.UTC {
		return sc, false
	}
	if t.MaxRetries != nil && *t.MaxRetries < 0 {
		return sc, false
	}
	rest := *t
	rest.ID, rest.Type, rest.InputDataURI, rest.OutputDataURI, rest.Parameters = "", "", "", "", nil
	// Each field the form holds is cleared by name: a field added to Task
	// or Metadata later stays set and sends the task to the JSON form
	// (TestSegmentTasksFormCoversTheFields lists them).
	rest.Metadata.CreatedAt, rest.Metadata.Priority, rest.Metadata.SourceSystem, rest.Metadata.Tenant = time.Time{}, 0, "", ""
	rest.Metadata.Budget, rest.Metadata.EstimatedTokens = "", 0 // the budget forms hold them
	rest.MaxRetries = nil
	rest.Timeout, rest.BackoffBase, rest.BackoffMax = 0, 0, 0
	rest.Parent, rest.ParentStep, rest.ParentQueue = "", 0, "" // the child form holds them
	if sc, ok = otelspan.Parse(t.TraceParent); ok {
		rest.TraceParent = "" // the traced forms hold it
	}
	rest.rev, rest.pendingRev, rest.seg = 0, 0, nil
	return sc, reflect.ValueOf(rest).IsZero()
}

// appendCreated appends a creation time: 0 for the zero time, else 1 and
// its Unix seconds and nanoseconds (whole nanoseconds since 1970 do not
// span the years 0000-9999 a submitter may give, and 0 of them is a time
// too).
func appendCreated(b []byte, at time.Time) []byte {
	if at.IsZero() {
		return binary.AppendVarint(b, 0)
	}
	b = binary.AppendVarint(b, 1)
	b = binary.AppendVarint(b, at.Unix())
	return binary.AppendVarint(b, int64(at.Nanosecond()))
}

// readCreated reads what appendCreated wrote.
func readCreated(r *varcodec.Reader) time.Time {
	if r.Varint() == 0 {
		return time.Time{}
	}
	sec, nsec := r.Varint(), r.Varint()
	if nsec < 0 || nsec >= 1e9 {
		return time.Time{} // damaged: Unix would carry it into the seconds
	}
	return time.Unix(sec, nsec).UTC()
}

// decodeTasks reads what encodeTasks wrote (after its format byte).
func decodeTasks(b []byte) ([]Task, error) {
	r := varcodec.NewReader(b)
	n := r.Count() // every task takes a byte at least
	if err := r.Err(); err != nil {
		return nil, err
	}
	if n > SegmentSize {
		return nil, fmt.Errorf("%d tasks: a segment holds at most %d", n, SegmentSize)
	}
	tasks := make([]Task, n)
	for i := range tasks {
		if err := readTask(r, &tasks[i]); err != nil {
			return nil, fmt.Errorf("task %d: %w", i, err)
		}
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("%d bytes after the last task", r.Len())
	}
	return tasks, nil
}

// readTask reads one task from r into t.
func readTask(r *varcodec.Reader, t *Task) error {
	kind := r.Byte()
	marks := kind & (taskTraced | taskBudget)
	if base := kind &^ marks; base == taskBinary || base == taskChild {
		kind = base
	} else {
		marks = 0 // the JSON form, or an unknown one
	}
	traced := marks&taskTraced != 0
	switch {
	case r.Err() != nil:
		return r.Err()
	case kind == taskJSON:
		raw := r.Bytes()
		if r.Err() != nil {
			return r.Err()
		}
		return json.Unmarshal(raw, t)
	case kind != taskBinary && kind != taskChild:
		return fmt.Errorf("unknown task form %#x", kind)
	}
	str := func() string { return string(r.Bytes()) }
	t.ID, t.Type, t.InputDataURI, t.OutputDataURI = str(), str(), str(), str()
	if p := r.Bytes(); len(p) > 0 {
		t.Parameters = json.RawMessage(bytes.Clone(p))
	}
	t.Metadata.CreatedAt = readCreated(r)
	t.Metadata.Priority = int(r.Varint())
	t.Metadata.SourceSystem, t.Metadata.Tenant = str(), str()
	if retries := r.Varint(); retries > 0 {
		m := int(retries - 1)
		t.MaxRetries = &m
	}
	t.Timeout, t.BackoffBase, t.BackoffMax = Duration(r.Varint()), Duration(r.Varint()), Duration(r.Varint())
	if kind == taskChild {
		t.Parent, t.ParentStep, t.ParentQueue = str(), int(r.Varint()), str()
	}
	if traced {
		raw := r.Bytes()
		if len(raw) != tracedLen && r.Err() == nil {
			return fmt.Errorf("traceparent of %d bytes, not %d", len(raw), tracedLen)
		}
		if len(raw) == tracedLen {
			t.TraceParent = otelspan.Format(trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID(raw[:16]),
				SpanID: trace.SpanID(raw[16:24]), TraceFlags: trace.TraceFlags(raw[24])}))
		}
	}
	if marks&taskBudget != 0 {
		t.Metadata.Budget, t.Metadata.EstimatedTokens = str(), r.Varint()
	}
	return r.Err()
}

// holdsLiveChild says whether tasks ts of segment st hold a child that has
// not finished: its purge must record its end for its parent.
func (st *segState) holdsLiveChild(ts []Task) bool {
	for slot, t := range ts {
		if t.Parent != "" && !st.finished(slot) {
			return true
		}
	}
	return false
}

// leaveLone marks the gathered sources of srcs that are alone in their
// level's due group (gatherWrites) to open as they are: rewriting one
// alone gains nothing. false: none is left to gather.
func leaveLone(srcs []dueSource) bool {
	from, members := map[int]time.Time{}, map[int][]int{} // per level: the group's first due time, its sources
	left := false
	end := func(lv int) {
		if len(members[lv]) == 1 {
			srcs[members[lv][0]].tasks = nil
		} else if len(members[lv]) > 1 {
			left = true
		}
		members[lv] = nil
	}
	for i, s := range srcs {
		if s.tasks == nil {
			continue
		}
		if len(members[s.level]) > 0 && s.due.Sub(from[s.level]) > DueGroup {
			end(s.level)
		}
		if len(members[s.level]) == 0 {
			from[s.level] = s.due
		}
		members[s.level] = append(members[s.level], i)
	}
	for lv := range members {
		end(lv)
	}
	return left
}
