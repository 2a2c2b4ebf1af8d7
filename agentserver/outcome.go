package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"unicode/utf8"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runOutcome is what a runtime reports when a run ends: its status, the
// thread's state and history from the checkpoint store, and the error.
type runOutcome struct {
	Token   int64         `json:"token" doc:"The fencing token of the runtime's claim of the run's task."`
	Status  string        `json:"status" enum:"success,error,interrupted,timeout"`
	State   *ThreadState  `json:"state,omitempty" doc:"The thread's state after the run."`
	History []ThreadState `json:"history,omitempty" doc:"The thread's states, newest first."`
	// HistoryAppend: History holds the run's new states only, down to one
	// the server keeps already (see appendHistory).
	HistoryAppend bool `json:"history_append,omitempty" doc:"history holds only the newest states, down to and with one that the thread's stored history holds: the server keeps its stored states older than that one after them, at most history_limit states in all. 412 when the stored history does not hold the last state sent (the runtime then sends the whole history)."`
	HistoryLimit  int  `json:"history_limit,omitempty" minimum:"0" doc:"The most states kept (default 100, and at most 100)."`
	Error         any  `json:"error,omitempty" doc:"The graph's error: {error, message}."`
	// Lock is the thread's lock the run's start took.
	Lock *outcomeLock `json:"lock,omitempty" doc:"The thread's lock the run's start (POST .../start) took: its name, token and contender. The outcome releases it in its own transaction, if it is still held with that token (a lock lost meanwhile, or held by another since, is left as it is, and the outcome is recorded all the same)."`
	// Events: the run's last events (see appendOutcomeEvents).
	Events     []RunEvent `json:"events,omitempty" maxItems:"1000" doc:"The run's last events, not yet written: appended to the run task's stream under the claim before the run ends, those a sending of this outcome before stored left out (see events_from), so that a retried outcome stores each once."`
	EventsFrom int64      `json:"events_from,omitempty" minimum:"0" doc:"With events: the seq the first of them is to take, the one after the last event of the runtime's attempt it knows stored (1 when it knows none). Of the events of the attempt the stream holds from there on (drover's own left out), the last k, when they are the first k of events (type and data), are taken as stored by a sending of this outcome before, the most k that match, and not appended again; others there are not counted."`
}

// endRun records run id's outcome on the run and its thread, if the
// runtime still holds the run's task under token: the transaction that
// writes the run and the thread compares the claim's fence (a runtime
// that lost its claim is refused, 409). The thread's status changes only
// when no other run of it is active: a later run's busy stays. With
// o.Lock, the thread's lock the run's start took is released in that
// transaction, if it is still held with its token.
//
// The claim the run's start read (cached by namespace, run and token:
// this route's own check is the token alone, as the start's read) is
// tried first, without a read of it: only the fenced transaction's
// success is answered from it (see endCached). Else the claim is read,
// as it is for each of the attempts after.
func (s *server) endRun(ctx context.Context, thread, id string, o runOutcome) (Run, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Run{}, err
	}
	rel, err := runLockRelease(sp, thread, o.Lock)
	if err != nil {
		return Run{}, err
	}
	ins, err := outcomeEventInputs(o)
	if err != nil {
		return Run{}, err
	}
	key := stream.ClaimKey{NS: s.cfg.Namespace(ctx), Task: id, Token: o.Token}
	defer s.cfg.Claims.Forget(key) // ended, refused or stale: the run's claim is not needed again
	if r, ok := s.endCached(ctx, sp, thread, id, o, key, &ins, rel); ok {
		return r, nil
	}
	q, err := s.queueOf(ctx)
	if err != nil {
		return Run{}, err
	}
	defer closeQueue(q)
	for range maxAttempts {
		cl, err := q.StreamClaim(ctx, queue.Held{Queue: RunsQueue, ID: id, Token: o.Token})
		if err != nil {
			if errors.Is(err, queue.ErrNotFound) {
				return Run{}, errRunNotFound(id)
			}
			if errors.Is(err, lease.ErrFenced) {
				return Run{}, huma.NewError(http.StatusConflict, "this runtime no longer holds the run under token "+fmt.Sprint(o.Token)+": "+err.Error())
			}
			return Run{}, etcdError("reading the run's claim", err)
		}
		if len(ins) > 0 { // stored before the end, which ends the stream; once
			if err := s.appendOutcomeEvents(ctx, sp, cl, o.EventsFrom, ins); err != nil {
				return Run{}, err
			}
			ins = nil
		}
		r, done, err := s.endOnce(ctx, sp, thread, id, o, cl.Fence.Compares(), rel, false)
		if err != nil || done {
			return r, err
		}
	}
	return Run{}, errRaced("the run")
}

// endCached is an attempt of endRun under the claim cached for key, if
// any: ok when its transaction, which compares the claim's fence, ended
// the run. Anything else (no claim cached, the compares failing, the run
// found ended already, an error) answers nothing: the claim may be stale,
// and what endRun answers then comes from reading it. Events appended
// under it are taken off *ins: they are stored, the claim held then.
func (s *server) endCached(ctx context.Context, sp keyspace.Space, thread, id string, o runOutcome, key stream.ClaimKey, ins *[]stream.Input, rel []clientv3.Op) (Run, bool) {
	cl, ok := s.cfg.Claims.Token(key)
	if !ok {
		return Run{}, false
	}
	if len(*ins) > 0 {
		if s.appendOutcomeEvents(ctx, sp, cl, o.EventsFrom, *ins) != nil {
			return Run{}, false
		}
		*ins = nil
	}
	r, done, err := s.endOnce(ctx, sp, thread, id, o, cl.Fence.Compares(), rel, true)
	return r, done && err == nil
}

// endOnce is one attempt of endRun, its claim read (fence, the claim's
// compares): it reads the run and its thread, and writes them ended in a
// transaction that compares what it read, with release (the run lock's,
// if any). done is false when that transaction found them changed. A
// cached claim, not read, proves nothing until that transaction: a run
// found ended under it is not done either (the claim is read then).
func (s *server) endOnce(ctx context.Context, sp keyspace.Space, thread, id string, o runOutcome, fence []clientv3.Cmp, release []clientv3.Op, cached bool) (Run, bool, error) {
	rd, err := s.outcomeReads(ctx, sp, thread, id, o)
	if err != nil {
		return Run{}, true, err
	}
	r := rd.run
	if r.Ended && cached {
		return Run{}, false, nil
	}
	if r.Ended { // a repeat, or the run was settled first: what it ended as stays
		if len(release) > 0 { // a repeat whose first answer was lost released it already
			s.releaseAlone(ctx, release)
		}
		s.admitNextLogged(ctx, thread) // the first may have ended before admitting
		return r.Run, true, nil
	}
	if rd.threadErr != nil {
		return Run{}, true, rd.threadErr
	}
	th := rd.thread
	other, err := s.othersNotEnded(ctx, sp, thread, id, rd.index)
	if err != nil {
		return Run{}, true, err
	}
	now := s.now()
	r.Status, r.Ended, r.Error, r.UpdatedAt = o.Status, true, capError(o.Error), now
	rraw, _ := json.Marshal(r)
	ops, cmps := []clientv3.Op{}, slices.Clip(fence) // the claim's, shared: appended to in a copy
	if o.State != nil {
		th.Values, th.Interrupts = o.State.Values, interruptsOf(o.State)
		hops, hcmps, err := s.outcomeHistory(ctx, sp, thread, o, rd, th, len(rraw))
		if err != nil {
			return Run{}, true, err
		}
		ops, cmps = append(ops, hops...), append(cmps, hcmps...)
	}
	if !other {
		th.Status = threadStatusAfter(o)
	}
	th.UpdatedAt = now
	traw, _ := json.Marshal(th)
	ops = append(ops, clientv3.OpPut(sp.AgentRun(thread, id), string(rraw)), clientv3.OpPut(sp.AgentThread(thread), string(traw)),
		clientv3.OpDelete(sp.AgentActiveRun(thread, id)))
	ops = append(ops, release...)
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(sp.AgentRun(thread, id)), "=", rd.runRev),
		clientv3.Compare(clientv3.ModRevision(sp.AgentThread(thread)), "=", rd.threadRev))
	resp, err := s.cfg.Etcd.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return Run{}, true, etcdError("ending the run", err)
	}
	if !resp.Succeeded {
		return Run{}, false, nil
	}
	// The thread's next enqueued run starts now; should this fail, the
	// next read of that run, or the next create, admits it. Without
	// another run not ended when the thread was read there is none: every
	// create writes the thread, which the transaction compared.
	if other {
		s.admitNextLogged(ctx, thread)
	}
	return r.Run, true, nil
}

// outcomeRead is what an outcome reads, in one transaction: the run's
// record, its thread's (or the error of its absence), the keys of the
// thread's index of active runs, and with history_append the newest state
// of the thread's history (its key, if any) and its gap mark, with their
// revisions.
type outcomeRead struct {
	run         runRecord
	runRev      int64
	thread      Thread
	threadRev   int64
	threadErr   error
	index, head []*mvccpb.KeyValue
	gap         bool
}

// outcomeReads reads what outcome o of run id needs (see outcomeRead).
// The run's status is its record's: the claim read before it is running.
func (s *server) outcomeReads(ctx context.Context, sp keyspace.Space, thread, id string, o runOutcome) (outcomeRead, error) {
	if err := s.ensureRunIndex(ctx, sp); err != nil {
		return outcomeRead{}, err
	}
	gets := []clientv3.Op{clientv3.OpGet(sp.AgentRun(thread, id)), clientv3.OpGet(sp.AgentThread(thread)),
		clientv3.OpGet(sp.AgentActiveRuns(thread), activeIndexOpts()...)}
	if o.State != nil && o.HistoryAppend {
		gets = append(gets, clientv3.OpGet(sp.AgentThreadHistoryStates(thread), clientv3.WithRange(historyEnd(sp, thread)), clientv3.WithLimit(1)),
			clientv3.OpGet(sp.AgentThreadHistoryGap(thread), clientv3.WithCountOnly()))
	}
	resp, err := s.cfg.Etcd.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return outcomeRead{}, etcdError("reading the run", err)
	}
	kvs := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	var rd outcomeRead
	if len(kvs(0)) == 0 {
		return rd, errRunNotFound(id)
	}
	if err := json.Unmarshal(kvs(0)[0].Value, &rd.run); err != nil {
		return rd, undecodable("run", id, err)
	}
	rd.runRev, rd.index = kvs(0)[0].ModRevision, kvs(2)
	if len(gets) > 3 {
		rd.head, rd.gap = kvs(3), resp.Responses[4].GetResponseRange().Count > 0
	}
	if len(kvs(1)) == 0 {
		rd.threadErr = errThreadNotFound(thread)
	} else if err := json.Unmarshal(kvs(1)[0].Value, &rd.thread); err != nil {
		rd.threadErr = undecodable("thread", thread, err)
	} else {
		rd.threadRev = kvs(1)[0].ModRevision
	}
	return rd, nil
}

// releaseAlone applies release, a run lock's release, in a transaction of
// its own; a failure is logged (the lock goes with the runtime's session).
func (s *server) releaseAlone(ctx context.Context, release []clientv3.Op) {
	if _, err := s.cfg.Etcd.Txn(ctx).Then(release...).Commit(); err != nil {
		slog.Default().Warn("agentserver: releasing a run's lock", "err", err)
	}
}

// threadStatusAfter is a thread's status after a run's outcome: error,
// interrupted when its state waits on an interrupt or before a node
// (interrupt_before), else idle.
func threadStatusAfter(o runOutcome) string {
	switch {
	case o.Status == "error":
		return "error"
	case o.State != nil && (len(interruptsOf(o.State)) > 0 || len(o.State.Next) > 0):
		return "interrupted"
	}
	return "idle"
}

// maxOutcomeBody is the largest outcome a runtime may send: the state and
// as much history as it sends; the server keeps what fits maxStoredState.
const maxOutcomeBody = 3 << 20

// maxStoredState bounds what an outcome stores in one transaction (the
// state record and the thread's values, which repeat the state's), well
// under etcd's 1.5 MiB request limit.
const maxStoredState = 1 << 20

// maxErrorBytes bounds the error an outcome stores on its run's record.
const maxErrorBytes = 16 << 10

// capError is error e as the run's record keeps it: e itself when its JSON
// fits maxErrorBytes, else {error, message} with the message (or e's JSON)
// cut to fit and marked as truncated.
func capError(e any) any {
	raw, _ := json.Marshal(e)
	if len(raw) <= maxErrorBytes {
		return e
	}
	m, _ := e.(map[string]any)
	name, _ := m["error"].(string)
	msg, ok := m["message"].(string)
	if !ok {
		msg = string(raw)
	}
	name, msg = cutUTF8(name, 256), cutUTF8(msg, maxErrorBytes-1<<10)
	return map[string]any{"error": name, "message": msg + fmt.Sprintf(" [truncated: the error took %d bytes]", len(raw))}
}

// cutUTF8 is s cut to at most n bytes, on a character boundary.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// outcomeHistory is what outcome o (o.State set) writes of the thread's
// state and history, with the compares that keep what it read of them
// until its transaction: the state record, and o's states, newest first,
// as many as fit maxStoredState beside thread th's record and the run's
// (runBytes long), as the history's keys: in place of the stored ones,
// or with history_append in place of the stored states down to o's last
// one, found by the checkpoint id of the newest stored state (else all
// are read), before those older than it. No other stored state is read or
// written: the outcome costs its own states. A state that does not fit
// alone is refused (413).
func (s *server) outcomeHistory(ctx context.Context, sp keyspace.Space, thread string, o runOutcome, rd outcomeRead, th Thread, runBytes int) ([]clientv3.Op, []clientv3.Cmp, error) {
	traw, _ := json.Marshal(th)
	st, _ := json.Marshal(o.State)
	room := maxStoredState - len(traw) - len(st) - runBytes - 4<<10 // keys and the rest
	if room < 0 {
		return nil, nil, huma.NewError(http.StatusRequestEntityTooLarge, fmt.Sprintf("body.state: the thread's state takes %d bytes, twice over with the thread's values and beside the run's record of %d bytes: at most %d bytes in all", len(st), runBytes, maxStoredState))
	}
	ops := []clientv3.Op{clientv3.OpPut(sp.AgentThreadState(thread), recordJSON(st))}
	limit := historyLimit(o)
	if !o.HistoryAppend {
		hist := o.History
		if len(hist) == 0 {
			hist = []ThreadState{*o.State}
		}
		enc := encodedStates(hist, limit, room)
		ops = append(ops, historyWrites(sp, thread, enc, historyBase, len(enc))...)
		return append(ops, clientv3.OpDelete(sp.AgentThreadHistoryGap(thread))), nil, nil
	}
	if rd.gap {
		return nil, nil, errHistoryNotJoined()
	}
	if len(rd.head) == 0 {
		return s.appendToLegacy(ctx, sp, thread, o, limit, room, ops)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(sp.AgentThreadHistoryGap(thread)), "=", 0)}
	n := len(o.History)
	if n == 0 { // nothing new: the stored history, cut to limit
		cut := sp.AgentThreadHistoryState(thread, historyPos(rd.head[0].Key)+uint64(limit))
		return append(ops, clientv3.OpDelete(cut, clientv3.WithRange(historyEnd(sp, thread)))), cmps, nil
	}
	anchor, err := s.historyAnchor(ctx, sp, thread, checkpointIDOf(o.History[n-1]), rd.head[0])
	if err != nil {
		return nil, nil, err
	}
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(anchor.Key)), "=", anchor.ModRevision))
	enc := encodedStates(o.History, limit, room)
	keep := len(enc)
	if keep == n { // the anchor kept: the stored states older than it follow, up to limit
		keep = limit
	}
	return append(ops, historyWrites(sp, thread, enc, historyPos(anchor.Key)-uint64(n-1), keep)...), cmps, nil
}

// historyLimit is the most states outcome o keeps: its history_limit, 100
// by default, and at most maxHistoryKept.
func historyLimit(o runOutcome) int {
	if o.HistoryLimit <= 0 {
		return defaultHistoryKept
	}
	return min(o.HistoryLimit, maxHistoryKept)
}

// historyAnchor is the key of the stored history state whose checkpoint id
// is anchor: head, the newest, as it mostly is (a run starts from the
// thread's latest checkpoint), else one the history's states, all read,
// hold. 412 when none does.
func (s *server) historyAnchor(ctx context.Context, sp keyspace.Space, thread, anchor string, head *mvccpb.KeyValue) (*mvccpb.KeyValue, error) {
	if anchor == "" {
		return nil, errHistoryNotJoined()
	}
	var id struct {
		Checkpoint struct {
			ID string `json:"checkpoint_id"`
		} `json:"checkpoint"`
	}
	if json.Unmarshal(head.Value, &id) == nil && id.Checkpoint.ID == anchor {
		return head, nil
	}
	h, err := s.readHistory(ctx, sp, thread, 0, false)
	if err != nil {
		return nil, err
	}
	for i, st := range h.states {
		if !h.legacy && checkpointIDOf(st) == anchor {
			return h.kvs[i], nil
		}
	}
	return nil, errHistoryNotJoined()
}

// appendToLegacy is outcomeHistory with history_append on a thread with no
// history key: its state record's history, of the previous layout (or
// none), is the stored one, and the history appended is written whole.
func (s *server) appendToLegacy(ctx context.Context, sp keyspace.Space, thread string, o runOutcome, limit, room int, ops []clientv3.Op) ([]clientv3.Op, []clientv3.Cmp, error) {
	key := sp.AgentThreadState(thread)
	resp, err := s.cfg.Etcd.Get(ctx, key)
	if err != nil {
		return nil, nil, etcdError("reading the thread's state", err)
	}
	var rec stateRecord
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(sp.AgentThreadHistoryStates(thread)).WithPrefix(), "=", 0),
		clientv3.Compare(clientv3.ModRevision(key), "=", 0)}
	if len(resp.Kvs) > 0 {
		cmps[1] = clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)
		if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
			return nil, nil, undecodable("thread state", thread, err)
		}
	}
	hist, ok := appendHistory(o.History, rec.History, limit)
	if !ok || rec.Gap {
		return nil, nil, errHistoryNotJoined()
	}
	enc := encodedStates(hist, limit, room)
	ops = append(ops, historyWrites(sp, thread, enc, historyBase, len(enc))...)
	return append(ops, clientv3.OpDelete(sp.AgentThreadHistoryGap(thread))), cmps, nil
}

// errHistoryNotJoined: an appended history whose last state the stored
// history does not hold, or one with a gap.
func errHistoryNotJoined() error {
	return huma.NewError(http.StatusPreconditionFailed, "body.history: the thread's stored history does not hold the last state sent, or lacks states older than it: send the whole history, without history_append")
}

// defaultHistoryKept is the most states an appended history keeps unless
// the outcome says otherwise (the runtime's default history limit).
const defaultHistoryKept = 100

// appendHistory is newer (newest first, its last state one that stored
// holds) followed by the states of stored older than that one, at most
// limit states; false when stored does not hold newer's last state (other
// states, such as those of a run stopped before its outcome, may lie
// between them). A run's states join the stored history this way instead
// of the runtime sending the whole history again with each run.
func appendHistory(newer, stored []ThreadState, limit int) ([]ThreadState, bool) {
	if len(newer) == 0 {
		return stored[:min(len(stored), limit)], true
	}
	anchor := checkpointIDOf(newer[len(newer)-1])
	for i, st := range stored {
		if anchor != "" && checkpointIDOf(st) == anchor {
			out := append(append(make([]ThreadState, 0, len(newer)+len(stored)-i-1), newer...), stored[i+1:]...)
			return out[:min(len(out), limit)], true
		}
	}
	return nil, false
}

// interruptsOf gathers the interrupts of a state's tasks, by task id.
func interruptsOf(st *ThreadState) map[string]any {
	out := map[string]any{}
	for _, t := range st.Tasks {
		m, _ := t.(map[string]any)
		if is, _ := m["interrupts"].([]any); len(is) > 0 {
			id, _ := m["id"].(string)
			out[id] = is
		}
	}
	return out
}
