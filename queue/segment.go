package queue

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// SegmentSize is the most tasks one segment holds: a submission request
// writes one segment with one index key per task, within etcd's 128
// operations a request.
const SegmentSize = 100

// maxSegmentBytes bounds a segment's encoded tasks before compression, so
// that its request stays under etcd's request size limit.
const maxSegmentBytes = 768 << 10

// maxSegmentDecoded bounds a segment's decompressed size when read.
const maxSegmentDecoded = 32 << 20

// flateWriters and flateReaders reuse DEFLATE's state: a new writer
// allocates about a megabyte, most of a small segment's encoding cost.
var (
	flateWriters = sync.Pool{New: func() any {
		zw, _ := flate.NewWriter(nil, flate.BestSpeed)
		return zw
	}}
	flateReaders = sync.Pool{New: func() any { return flate.NewReader(nil) }}
)

// encodeSegment writes tasks in their binary form (segtasks.go),
// compressed with DEFLATE.
// Tasks of one submission look alike, so a segment takes a fraction of the
// bytes of their records.
func encodeSegment(tasks []Task) ([]byte, error) {
	raw, err := encodeTasks(tasks)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw := flateWriters.Get().(*flate.Writer)
	defer flateWriters.Put(zw)
	zw.Reset(&buf)
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeSegment reads what encodeSegment wrote.
func decodeSegment(b []byte) ([]Task, error) {
	zr := flateReaders.Get().(io.ReadCloser)
	defer flateReaders.Put(zr)
	if err := zr.(flate.Resetter).Reset(bytes.NewReader(b), nil); err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	// A damaged value must not decompress into gigabytes: a segment is at
	// most maxSegmentBytes of tasks as estimated, with room for escapes.
	raw, err := io.ReadAll(io.LimitReader(zr, maxSegmentDecoded+1))
	if err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	if len(raw) > maxSegmentDecoded {
		return nil, fmt.Errorf("decompress: over %d bytes", maxSegmentDecoded)
	}
	switch js := bytes.TrimLeft(raw, " \t\n\r"); {
	case len(raw) > 0 && (raw[0] == segTasksV1 || raw[0] == segTasksBudget):
		return decodeTasks(raw[1:])
	case len(js) == 0 || js[0] == '[' || js[0] == 'n': // JSON: an array, null, or nothing (an error)
		var tasks []Task
		if err := json.Unmarshal(raw, &tasks); err != nil {
			return nil, err
		}
		return tasks, nil
	default:
		return nil, fmt.Errorf("%w: leading byte 0x%02x", errSegmentFormat, raw[0])
	}
}

// errSegmentFormat is the error of a segment whose value decompresses
// but starts with a byte that names no format this drover knows: a newer
// drover wrote it (a rolling upgrade), so it is skipped, never
// quarantined. Every segment value is a DEFLATE stream whose first byte
// names its format; a new format keeps the stream and takes a new byte.
var errSegmentFormat = errors.New("segment of a format this drover does not know (written by a newer drover?)")

// runValue is what a run and its try hold (their stored form is
// taskstore's).
type runValue = taskstore.Run

// outValue is one batch of outcomes of a run.
type outValue = taskstore.Out

type okSlot = taskstore.OKSlot

// segState is a segment's state as one read saw it.
type segState struct {
	name string
	rev  int64 // the revision of the read
	open bool
	// scheduled: the segment is in the due index, its tasks SCHEDULED
	// until due.
	scheduled bool
	due       time.Time
	n         int // tasks in the segment
	runs      []runRef
	tries     []runRef
	ok        map[int]okRef
	moved     map[int]bool
	exits     map[int]bool
	// purgedOK counts the slots that succeeded and were purged since.
	purgedOK int
	// unreadable counts the run, try and outcome values that could not be
	// decoded: claims take nothing from such a segment.
	unreadable int
}

// okSlots is s.ok without the outcomes' results and records, as a state
// kept for the next claim holds it: claims look only at which slots
// succeeded, and a state kept per session would otherwise hold its
// segment's results (s.ok itself when it holds none).
func (s *segState) okSlots() map[int]okRef {
	trimmed := true
	for _, r := range s.ok {
		if r.out != nil || r.Result != nil {
			trimmed = false
			break
		}
	}
	if trimmed {
		return s.ok
	}
	ok := make(map[int]okRef, len(s.ok))
	for slot, r := range s.ok {
		ok[slot] = okRef{okSlot: okSlot{Slot: r.Slot, Attempt: r.Attempt}}
	}
	return ok
}

type runRef struct {
	key   string
	rest  string // the name below the segment: a run and its try share it
	token int64  // create revision
	v     runValue
}

type okRef struct {
	okSlot
	out *outValue
}

// stateOps are the reads of segment seg's state, in the order parseState
// takes them.
func (c *Client) stateOps(q, seg string) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpGet(c.keys.SegmentOpen(q, seg)),
		clientv3.OpGet(c.keys.Runs(q, seg), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.Tries(q, seg), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.Outs(q, seg), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.Exits(q, seg), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.keys.SegmentDue(q, seg), clientv3.WithPrefix()), // with its count or without
	}
}

// parseState reads the responses of stateOps.
func (c *Client) parseState(q, seg string, rev int64, rs []*pb.ResponseOp) *segState {
	st := &segState{name: seg, rev: rev, ok: map[int]okRef{}, moved: map[int]bool{}, exits: map[int]bool{}}
	if kvs := rs[0].GetResponseRange().Kvs; len(kvs) > 0 {
		st.open = true
		st.n, _ = strconv.Atoi(string(kvs[0].Value))
	}
	refs := func(pre string, kvs []*mvccpb.KeyValue) []runRef {
		var out []runRef
		for _, kv := range kvs {
			v, err := taskstore.DecodeRun(kv.Value)
			if err != nil {
				st.unreadable++
				continue
			}
			out = append(out, runRef{key: string(kv.Key), rest: strings.TrimPrefix(string(kv.Key), pre), token: kv.CreateRevision, v: v})
		}
		return out
	}
	st.runs = refs(c.keys.Runs(q, seg), rs[1].GetResponseRange().Kvs)
	st.tries = refs(c.keys.Tries(q, seg), rs[2].GetResponseRange().Kvs)
	for _, kv := range rs[3].GetResponseRange().Kvs {
		o, err := taskstore.DecodeOut(kv.Value)
		if err != nil {
			st.unreadable++
			continue
		}
		for _, s := range o.OK {
			st.ok[s.Slot] = okRef{okSlot: s, out: o}
		}
		for _, s := range o.Moved {
			st.moved[s] = true
		}
	}
	for _, kv := range rs[4].GetResponseRange().Kvs {
		if s, done, ok := c.keys.ParseExitKey(q, seg, string(kv.Key)); ok {
			st.exits[s] = true
			if done {
				st.purgedOK++
			}
		}
	}
	if kvs := rs[5].GetResponseRange().Kvs; len(kvs) > 0 {
		st.scheduled = true
		_, st.due, _ = keyspace.ParseSegmentName(seg)
		st.n, _ = strconv.Atoi(string(kvs[0].Value))
	}
	return st
}

// readState reads segment seg's state in one request.
func (c *Client) readState(ctx context.Context, q, seg string) (*segState, error) {
	resp, err := c.cli.Txn(ctx).Then(c.stateOps(q, seg)...).Commit()
	if err != nil {
		return nil, fmt.Errorf("queue: read segment %s of %s: %w", seg, q, err)
	}
	return c.parseState(q, seg, resp.Header.Revision, resp.Responses), nil
}

// vanished reports whether the segment read as s has no key but its
// record (a cached one): neither scheduled nor open, and nothing that
// would close it happened in it. A scheduled segment gathered into another
// at its move (gatherDue) reads so.
func (s *segState) vanished() bool {
	return !s.open && !s.scheduled && len(s.runs) == 0 && len(s.ok) == 0 && len(s.moved) == 0 && len(s.exits) == 0 && s.purgedOK == 0
}

// finished reports whether slot has left the running: it succeeded, moved
// to a record of its own, or exited.
func (s *segState) finished(slot int) bool {
	_, ok := s.ok[slot]
	return ok || s.moved[slot] || s.exits[slot]
}

// runOf returns the live run that holds slot, if any.
func (s *segState) runOf(slot int) (runRef, int, bool) {
	for _, r := range s.runs {
		if i := slices.Index(r.v.Slots, slot); i >= 0 {
			return r, r.v.Attempts[i], true
		}
	}
	return runRef{}, 0, false
}

// attempts returns how many attempts of slot were started: the most any try
// records.
func (s *segState) attempts(slot int) int {
	n := 0
	for _, r := range s.tries {
		if i := slices.Index(r.v.Slots, slot); i >= 0 {
			n = max(n, r.v.Attempts[i])
		}
	}
	return n
}

// free returns the slots nobody runs and that have not finished, in order.
func (s *segState) free() []int {
	var out []int
	for i := 0; i < s.n; i++ {
		if s.finished(i) {
			continue
		}
		if _, _, held := s.runOf(i); held {
			continue
		}
		out = append(out, i)
	}
	return out
}

// done reports whether every slot has finished and no run is left.
func (s *segState) done() bool {
	if len(s.runs) > 0 {
		return false
	}
	for i := 0; i < s.n; i++ {
		if !s.finished(i) {
			return false
		}
	}
	return true
}

// fill sets t's status and history from the segment's state: t is the task
// of slot as submitted. It returns false when the slot has left the
// segment (the task's record, if any, says the rest).
func (s *segState) fill(t *Task, slot int) bool {
	if s.moved[slot] || s.exits[slot] {
		return false
	}
	created := t.Metadata.CreatedAt
	t.Transitions = submittedHistory(s.name, created)
	if ok, done := s.ok[slot]; done {
		t.Transitions = appendLost(t.Transitions, ok.Attempt, ok.out.ClaimedAt)
		t.Transitions = append(t.Transitions,
			Transition{Status: Running, At: ok.out.ClaimedAt, Attempt: ok.Attempt, Worker: ok.out.Worker},
			Transition{Status: Succeeded, At: ok.out.FinishedAt, Attempt: ok.Attempt, Worker: ok.out.Worker})
		t.CurrentStatus, t.Attempt, t.Token, t.Result, t.RetriesAttempted = Succeeded, ok.Attempt, ok.out.Token, ok.Result, ok.Attempt-1
		return true
	}
	if r, attempt, held := s.runOf(slot); held {
		t.Transitions = appendLost(t.Transitions, attempt, r.v.ClaimedAt)
		t.Transitions = append(t.Transitions, Transition{Status: Running, At: r.v.ClaimedAt, Attempt: attempt, Worker: r.v.Worker})
		t.CurrentStatus, t.Attempt, t.Token = Running, attempt, r.token
		return true
	}
	if s.scheduled {
		t.Transitions = []Transition{{Status: Scheduled, At: created}}
		t.CurrentStatus, t.ScheduledAt = Scheduled, s.due.UTC()
		return true
	}
	t.CurrentStatus, t.Attempt = Pending, s.attempts(slot)
	t.Transitions = appendLost(t.Transitions, t.Attempt+1, created)
	return true
}

// segmentCache keeps decoded segments, which never change once written, so
// that a worker claiming several runs of one segment decodes it once.
type segmentCache struct {
	mu    sync.Mutex
	segs  map[string][]Task
	order []string
}

const segmentCacheSize = 64

func (sc *segmentCache) get(seg string) ([]Task, bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	t, ok := sc.segs[seg]
	return t, ok
}

func (sc *segmentCache) put(seg string, tasks []Task) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.segs == nil {
		sc.segs = map[string][]Task{}
	}
	if _, ok := sc.segs[seg]; ok {
		return
	}
	if len(sc.order) >= segmentCacheSize {
		delete(sc.segs, sc.order[0])
		sc.order = sc.order[1:]
	}
	sc.segs[seg] = tasks
	sc.order = append(sc.order, seg)
}

// segmentTasks returns segment seg's tasks, from the cache or from etcd.
func (c *Client) segmentTasks(ctx context.Context, q, seg string) ([]Task, error) {
	if ts, ok := c.segCache.get(q + "/" + seg); ok {
		return ts, nil
	}
	g, err := c.cli.Get(ctx, c.keys.Segment(q, seg))
	if err != nil {
		return nil, fmt.Errorf("queue: read segment %s of %s: %w", seg, q, err)
	}
	if len(g.Kvs) == 0 {
		return nil, nil
	}
	return c.cacheSegment(q, seg, g.Kvs[0].Value)
}

// cacheSegment decodes a segment's value and keeps it.
func (c *Client) cacheSegment(q, seg string, v []byte) ([]Task, error) {
	ts, err := decodeSegment(v)
	if err != nil {
		return nil, fmt.Errorf("queue: segment %s of %s is unreadable: %w", seg, q, err)
	}
	for i := range ts {
		ts[i].Queue = q
	}
	c.segCache.put(q+"/"+seg, ts)
	return ts, nil
}

// taskOf returns a copy of the task of slot, ready to be filled in.
func taskOf(ts []Task, slot int) (*Task, bool) {
	if slot < 0 || slot >= len(ts) {
		return nil, false
	}
	t := ts[slot]
	t.Transitions = nil
	return &t, true
}

// segmentSlot is a task found by its index key in a segment.
type segmentSlot struct {
	id string
	at keyspace.TaskPlace
}

// segRef is where a task read from a segment is, and the revision of the
// read that found its state.
type segRef struct {
	queue, seg string
	slot       int
	rev        int64
}

// segmentSlots reads the tasks of slots from their segments, one read of
// state per segment. Tasks that left their segment in between (a record of
// their own holds them now) are returned as moved, by id; purged ones are
// left out.
func (c *Client) segmentSlots(ctx context.Context, slots []segmentSlot) (tasks []*Task, moved []string, err error) {
	if testHookSegmentSlots != nil {
		testHookSegmentSlots() // the index keys read, the segments not yet
	}
	tasks, moved, gone, err := c.segmentSlotsAt(ctx, slots)
	if err != nil || len(gone) == 0 {
		return tasks, moved, err
	}
	// A scheduled segment gathered into another at its move (gatherDue)
	// between the read of its tasks' index keys and of its record: read
	// their index keys again, once (a gathered segment is never moved).
	ops := make([]clientv3.Op, len(gone))
	for i, s := range gone {
		ops[i] = clientv3.OpGet(c.keys.TaskIndex(s.id))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("queue: read tasks: %w", err)
	}
	var again []segmentSlot
	for i, s := range gone {
		if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			if at, ok := keyspace.ParseTaskPlace(string(kvs[0].Value)); ok && at != s.at {
				again = append(again, segmentSlot{id: s.id, at: at})
			}
		}
	}
	more, movedMore, _, err := c.segmentSlotsAt(ctx, again)
	return append(tasks, more...), append(moved, movedMore...), err
}

// testHookSegmentSlots, set by tests only, runs after the index keys of
// segmentSlots' tasks were read and before their segments are.
var testHookSegmentSlots func()

// segmentSlotsAt is segmentSlots without following a task whose segment
// is gone: those are returned in gone.
func (c *Client) segmentSlotsAt(ctx context.Context, slots []segmentSlot) (tasks []*Task, moved []string, gone []segmentSlot, err error) {
	type segKey struct{ q, seg string }
	states := map[segKey]*segState{}
	for _, s := range slots {
		k := segKey{s.at.Queue, s.at.Segment}
		st := states[k]
		if st == nil {
			if st, err = c.readState(ctx, k.q, k.seg); err != nil {
				return nil, nil, nil, err
			}
			states[k] = st
		}
		ts, err := c.segmentTasks(ctx, k.q, k.seg)
		if err != nil {
			return nil, nil, nil, c.unreadable(ctx, k.q, k.seg, err)
		}
		if ts == nil || st.vanished() {
			gone = append(gone, s)
			continue // removed after its retention, or gathered
		}
		t, ok := taskOf(ts, s.at.Slot)
		if !ok || t.ID != s.id {
			continue
		}
		if !st.open && st.n == 0 {
			st.n = len(ts) // a closed segment: every slot is finished
		}
		if !st.fill(t, s.at.Slot) {
			if st.moved[s.at.Slot] || st.exits[s.at.Slot] { // cancelled ones have records
				moved = append(moved, s.id)
			}
			continue
		}
		t.seg = &segRef{queue: k.q, seg: k.seg, slot: s.at.Slot, rev: st.rev}
		tasks = append(tasks, t)
	}
	return tasks, moved, gone, nil
}

// purgeScheduledSegments removes, with deletes only (so that it works
// while etcd refuses writes that grow it), queue q's scheduled segments:
// each one's due key, record, exits and the index keys and checkpoints of
// its tasks (those cancelled while scheduled keep their records). A
// segment that fell due or had a task cancelled since its read is left to
// the caller, which purges it task by task. It returns how many tasks it
// removed.
func (c *Client) purgeScheduledSegments(ctx context.Context, q string, progress func(int)) (int, error) {
	removed := 0
	pre := c.keys.QueueDue(q)
	for from := pre; ; {
		g, err := c.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithKeysOnly(), clientv3.WithLimit(openRead))
		if err != nil {
			return removed, fmt.Errorf("queue: purge %s: %w", q, err)
		}
		for _, kv := range g.Kvs {
			n, err := c.purgeScheduled(ctx, q, string(kv.Key), kv.ModRevision)
			if err != nil {
				return removed, err
			}
			if removed += n; progress != nil && n > 0 {
				progress(removed)
			}
		}
		if !g.More || len(g.Kvs) == 0 {
			return removed, nil
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}

// purgeScheduled removes the scheduled segment whose due key is key, at
// revision rev, if it is still scheduled and no task of it left since its
// read; it returns how many tasks went.
func (c *Client) purgeScheduled(ctx context.Context, q, key string, rev int64) (int, error) {
	seg, _, _ := c.parseDue(q, key)
	if seg == "" {
		return 0, nil
	}
	st, err := c.readState(ctx, q, seg)
	if err != nil || !st.scheduled {
		return 0, err
	}
	ts, err := c.segmentTasks(ctx, q, seg)
	if err != nil || ts == nil || st.holdsLiveChild(ts) {
		return 0, err // a live child's purge tells its parent: task by task
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(key), "=", rev),
		clientv3.Compare(clientv3.ModRevision(c.keys.Exits(q, seg)).WithPrefix(), "<", st.rev+1),
	}
	ops := []clientv3.Op{
		clientv3.OpDelete(key), clientv3.OpDelete(c.keys.Segment(q, seg)),
		clientv3.OpDelete(c.keys.Exits(q, seg), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.Tries(q, seg), clientv3.WithPrefix()),
		clientv3.OpDelete(c.keys.QueueDueVersion(q)), // a delete, not a put: Stats' count is stale
	}
	var checkpoints []clientv3.Op
	for slot := range ts {
		if !st.finished(slot) {
			ops = append(ops, clientv3.OpDelete(c.keys.TaskIndex(ts[slot].ID)))
			checkpoints = append(checkpoints, clientv3.OpDelete(c.keys.Task(ts[slot].ID), clientv3.WithPrefix()))
		}
	}
	resp, err := c.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("queue: purge %s: %w", q, err)
	}
	if !resp.Succeeded {
		return 0, nil
	}
	// The tasks are gone: whatever is stored under their ids goes after
	// them (a segment's tasks and their deletes would not fit one request).
	if len(checkpoints) > 0 {
		if _, err := c.cli.Txn(ctx).Then(checkpoints...).Commit(); err != nil {
			return 0, fmt.Errorf("queue: purge %s: %w", q, err)
		}
	}
	return len(checkpoints), nil
}
