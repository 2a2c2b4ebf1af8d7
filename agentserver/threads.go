package agentserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Thread is a conversation: the state runs of a graph accumulate, by
// checkpoints. Its fields and their JSON are LangGraph's. Status is idle
// until runs are served: then busy while one holds the thread's fence,
// interrupted or error as its last run left it.
type Thread struct {
	ThreadID   string         `json:"thread_id" doc:"Its id, a UUID."`
	CreatedAt  time.Time      `json:"created_at"`
	UpdatedAt  time.Time      `json:"updated_at"`
	Metadata   map[string]any `json:"metadata"`
	Status     string         `json:"status" enum:"idle,busy,interrupted,error"`
	Config     map[string]any `json:"config"`
	Values     any            `json:"values" doc:"The state of its latest checkpoint; null before its first."`
	Interrupts map[string]any `json:"interrupts" doc:"The interrupts its latest checkpoint waits on, by task."`
}

func errThreadNotFound(id string) error {
	return huma.NewError(http.StatusNotFound, fmt.Sprintf("Thread with ID %s not found", id))
}

// getThread reads thread id and its revision; 404 when there is none.
func (s *server) getThread(ctx context.Context, id string) (Thread, int64, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Thread{}, 0, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentThread(id))
	if err != nil {
		return Thread{}, 0, etcdError("reading the thread", err)
	}
	if len(resp.Kvs) == 0 {
		return Thread{}, 0, errThreadNotFound(id)
	}
	var t Thread
	if err := json.Unmarshal(resp.Kvs[0].Value, &t); err != nil {
		return Thread{}, 0, undecodable("thread", id, err)
	}
	return t, resp.Kvs[0].ModRevision, nil
}

// createThread stores t unless its id is taken: then it returns the one
// stored when doNothing, else 409. A full store refuses it (507).
func (s *server) createThread(ctx context.Context, t Thread, doNothing bool) (Thread, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Thread{}, err
	}
	raw, _ := json.Marshal(t)
	key := sp.AgentThread(t.ThreadID)
	old, err := createOnce[Thread](ctx, s, sp, "Thread", t.ThreadID, key, []clientv3.Op{clientv3.OpPut(key, string(raw))}, doNothing)
	if err != nil {
		return Thread{}, err
	}
	if old == nil {
		return t, nil
	}
	return *old, nil
}

// patchThread merges metadata into thread id's, compared with what it
// read: a change that raced another is read and applied again. A full
// store refuses it (507).
func (s *server) patchThread(ctx context.Context, id string, metadata map[string]any) (Thread, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Thread{}, err
	}
	key := sp.AgentThread(id)
	for range maxAttempts {
		t, rev, err := s.getThread(ctx, id)
		if err != nil {
			return Thread{}, err
		}
		m := make(map[string]any, len(t.Metadata)+len(metadata))
		for k, v := range t.Metadata {
			m[k] = v
		}
		for k, v := range metadata {
			m[k] = v
		}
		t.Metadata, t.UpdatedAt = m, s.now()
		raw, _ := json.Marshal(t)
		resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev), storeguard.NotFull(sp)).
			Then(clientv3.OpPut(key, string(raw))).Else(storeguard.GetOp(sp)).Commit()
		if err != nil {
			return Thread{}, etcdError("updating the thread", err)
		}
		if resp.Succeeded {
			return t, nil
		}
		if err := guardOf(resp, 0); err != nil {
			return Thread{}, err
		}
	}
	return Thread{}, errRaced("the thread")
}

// deleteThread deletes thread id with its runs' records, its state and
// its checkpoints; 404 when there is none. Its crons go first, so that
// none fires into it, then the tasks of its runs not ended are cancelled
// (a run whose task is not submitted yet gets a cancelled placeholder),
// and last one transaction deletes the thread, comparing its revision
// with the one read before its runs: a run admitted meanwhile makes the
// delete cancel again. A delete cut short leaves the thread, and sending
// it again finishes the job.
func (s *server) deleteThread(ctx context.Context, id string) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	if _, _, err := s.getThread(ctx, id); err != nil {
		return err
	}
	if err := s.dropThreadCrons(ctx, id); err != nil {
		return err
	}
	q, err := s.queueOf(ctx)
	if err != nil {
		return err
	}
	defer closeQueue(q)
	key := sp.AgentThread(id)
	for range maxAttempts {
		_, rev, err := s.getThread(ctx, id)
		if err != nil {
			return err
		}
		runs, _, err := s.runRecords(ctx, id)
		if err != nil {
			return err
		}
		for _, r := range runs {
			if r.Ended || r.Queued {
				continue
			}
			if err := cancelRunTask(ctx, q, r); err != nil {
				return err
			}
		}
		resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(threadDeletes(sp, id)...).Commit()
		if err != nil {
			return etcdError("deleting the thread", err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return errRaced("the thread")
}

// threadDeletes deletes thread id with its runs' records, its state, its
// history and its checkpoints.
func threadDeletes(sp keyspace.Space, id string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpDelete(sp.AgentThread(id)), clientv3.OpDelete(sp.AgentRuns(id), clientv3.WithPrefix()),
		clientv3.OpDelete(sp.AgentActiveRuns(id), clientv3.WithPrefix()),
		clientv3.OpDelete(sp.AgentThreadState(id)), clientv3.OpDelete(sp.AgentThreadHistory(id), clientv3.WithPrefix()),
		clientv3.OpDelete(sp.Checkpoints(id), clientv3.WithPrefix())}
}

// deleteThreadsWhere deletes each thread f picks, each unless it changed
// since it was read: one that did is read again and deleted if f still
// picks it, within maxAttempts. It returns an error unless every thread
// f picks is gone, so that a caller can retry until it is.
func (s *server) deleteThreadsWhere(ctx context.Context, f func(Thread) bool) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentThreads(), clientv3.WithPrefix())
	if err != nil {
		return etcdError("listing threads", err)
	}
	for _, kv := range resp.Kvs {
		key, rev, value := string(kv.Key), kv.ModRevision, kv.Value
		for attempt := 0; ; attempt++ {
			var t Thread
			if json.Unmarshal(value, &t) != nil || !f(t) { // one that does not decode names no assistant
				break
			}
			if attempt == maxAttempts {
				return errRaced("a thread to delete")
			}
			d, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
				Then(threadDeletes(sp, idOf(kv.Key))...).Else(clientv3.OpGet(key)).Commit()
			if err != nil {
				return etcdError("deleting threads", err)
			}
			if d.Succeeded {
				break
			}
			kvs := d.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 { // deleted by another
				break
			}
			rev, value = kvs[0].ModRevision, kvs[0].Value
		}
	}
	return nil
}

// threadFilter is what a thread search or count matches.
type threadFilter struct {
	Metadata map[string]any `json:"metadata,omitempty" doc:"Only threads whose metadata contains this (as jsonb @>)."`
	Values   map[string]any `json:"values,omitempty" doc:"Only threads whose values contain this."`
	Status   string         `json:"status,omitempty" enum:"idle,busy,interrupted,error"`
}

func (f threadFilter) match(t Thread) bool {
	return (f.Metadata == nil || contains(map[string]any(t.Metadata), map[string]any(f.Metadata))) &&
		(f.Values == nil || contains(t.Values, map[string]any(f.Values))) &&
		(f.Status == "" || t.Status == f.Status)
}

// listThreads returns the threads f matches (and ids, when any are given),
// sorted by field by (created_at when "") in order ("desc" when "").
func (s *server) listThreads(ctx context.Context, f threadFilter, ids []string, by, order string) ([]Thread, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentThreads(), clientv3.WithPrefix())
	if err != nil {
		return nil, etcdError("listing threads", err)
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var found []listed[Thread]
	for _, kv := range resp.Kvs {
		var t Thread
		if err := json.Unmarshal(kv.Value, &t); err != nil {
			return nil, undecodable("thread", idOf(kv.Key), err)
		}
		if (len(want) == 0 || want[t.ThreadID]) && f.match(t) {
			found = append(found, listed[Thread]{t, kv.CreateRevision, kv.ModRevision})
		}
	}
	return sorted(found, order, func(l listed[Thread]) string {
		switch by {
		case "thread_id":
			return l.v.ThreadID
		case "status":
			return l.v.Status + l.v.ThreadID
		case "updated_at":
			return sortTime(l.v.UpdatedAt) + revKey(l.modRev)
		}
		return sortTime(l.v.CreatedAt) + revKey(l.createRev)
	}), nil
}

// copyBatch bounds the checkpoint keys a copy writes in one transaction.
const copyBatch = 64

// copyBatchBytes bounds the bytes (keys and values) a copy writes in one
// transaction, below etcd's request limit (1.5 MiB by default); a batch
// holds at least one key, a checkpoint of at most checkpoint.MaxState.
const copyBatchBytes = 1 << 20

// copyThread copies thread id to a new thread, as LangGraph does: its
// metadata (thread_id set to the new id), its values, its checkpoints
// and their pending writes (the old id replaced by the new one in their
// thread ids and metadata), and its state and history; not its runs. The
// checkpoints are written first, under the new id that nothing reads
// yet, then the thread and its state in one transaction; a copy that
// fails takes its checkpoints back, and one interrupted by a crash is
// swept by a later copy (sweepCopies).
func (s *server) copyThread(ctx context.Context, id string) (Thread, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Thread{}, err
	}
	old, _, err := s.getThread(ctx, id)
	if err != nil {
		return Thread{}, err
	}
	h, err := s.readHistory(ctx, sp, id, 0, true)
	if err != nil {
		return Thread{}, err
	}
	now := s.now()
	t := Thread{ThreadID: s.ids.next(now), CreatedAt: now, UpdatedAt: now, Metadata: map[string]any{}, Status: "idle",
		Config: map[string]any{}, Values: old.Values, Interrupts: orEmpty(old.Interrupts)}
	for k, v := range old.Metadata {
		t.Metadata[k] = v
	}
	t.Metadata["thread_id"] = t.ThreadID
	s.sweepCopies(ctx, sp)
	// Every write of the copy compares its mark: a copy swept as a
	// crashed one (a member's clock far ahead) fails, rather than
	// creating a thread without its checkpoints.
	marked, err := s.markCopy(ctx, sp, id, t.ThreadID)
	if err != nil {
		return Thread{}, err
	}
	undo := func() { // the mark last, in one transaction: no key is left unmarked
		_, _ = s.cfg.Etcd.Txn(context.WithoutCancel(ctx)).Then(clientv3.OpDelete(sp.Checkpoints(t.ThreadID), clientv3.WithPrefix()),
			clientv3.OpDelete(sp.AgentThreadHistory(t.ThreadID), clientv3.WithPrefix()), clientv3.OpDelete(sp.AgentThreadCopy(t.ThreadID))).Commit()
	}
	if err := s.copyCheckpoints(ctx, sp, id, t.ThreadID, marked); err != nil {
		undo()
		return Thread{}, err
	}
	if afterCopyCheckpoints != nil {
		afterCopyCheckpoints(t.ThreadID)
	}
	var hist [][2]string // the history's keys and values, at the positions from historyBase on
	for i, st := range h.states[:min(len(h.states), maxHistoryKept)] {
		raw, _ := json.Marshal(copiedState(st, id, t.ThreadID))
		hist = append(hist, [2]string{sp.AgentThreadHistoryState(t.ThreadID, historyBase+uint64(i)), string(raw)})
	}
	if err := s.putBatches(ctx, sp, "copying the thread's history", hist, marked); err != nil {
		undo()
		return Thread{}, err
	}
	sraw, _ := json.Marshal(copiedState(h.rec.State, id, t.ThreadID))
	traw, _ := json.Marshal(t)
	tkey := sp.AgentThread(t.ThreadID)
	ops := []clientv3.Op{clientv3.OpPut(tkey, string(traw)), clientv3.OpPut(sp.AgentThreadState(t.ThreadID), recordJSON(sraw)),
		clientv3.OpDelete(sp.AgentThreadCopy(t.ThreadID))}
	if h.gap {
		ops = append(ops, clientv3.OpPut(sp.AgentThreadHistoryGap(t.ThreadID), "1"))
	}
	put, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(tkey), "=", 0), storeguard.NotFull(sp), marked).
		Then(ops...).Else(storeguard.GetOp(sp)).Commit()
	switch {
	case err != nil:
		err = etcdError("creating the copy", err)
	case !put.Succeeded:
		if err = guardOf(put, 0); err == nil {
			// Swept as crashed while it ran (its mark changed), or its new id taken: once, not a race lost 16 times.
			err = huma.NewError(http.StatusConflict, "the copy was interrupted (its keys were swept, or its new id was taken before it finished); nothing was copied: copy the thread again")
		}
	}
	if err != nil {
		undo()
		return Thread{}, err
	}
	return t, nil
}

// copyCheckpoints writes thread from's checkpoint keys under thread to,
// the id from replaced by to in their values, in batches; not its fence
// nor a request to stop its run.
func (s *server) copyCheckpoints(ctx context.Context, sp keyspace.Space, from, to string, marked clientv3.Cmp) error {
	resp, err := s.cfg.Etcd.Get(ctx, sp.Checkpoints(from), clientv3.WithPrefix())
	if err != nil {
		return etcdError("reading the thread's checkpoints", err)
	}
	kvs := make([][2]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), sp.Checkpoints(from))
		if string(kv.Key) == sp.CheckpointInterrupt(from) || strings.HasSuffix(rest, "/fence") {
			continue // a run's request to stop, and the tokens seen: the old thread's own
		}
		kvs = append(kvs, [2]string{sp.Checkpoints(to) + rest, strings.ReplaceAll(string(kv.Value), from, to)})
	}
	return s.putBatches(ctx, sp, "copying the thread's checkpoints", kvs, marked)
}

// putBatches puts kvs (key, value), in transactions of at most copyBatch
// keys and copyBatchBytes bytes, each while the store is not full and
// the copy's mark is as written (marked).
func (s *server) putBatches(ctx context.Context, sp keyspace.Space, what string, kvs [][2]string, marked clientv3.Cmp) error {
	var ops []clientv3.Op
	size := 0 // the bytes of ops' keys and values
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		put, err := s.cfg.Etcd.Txn(ctx).If(storeguard.NotFull(sp), marked).Then(ops...).Else(storeguard.GetOp(sp)).Commit()
		ops, size = ops[:0], 0
		if err != nil {
			return etcdError(what, err)
		}
		if !put.Succeeded {
			if err := guardOf(put, 0); err != nil {
				return err
			}
			return huma.NewError(http.StatusConflict, what+": the copy was taken for one interrupted by a crash (its mark is gone); retry")
		}
		return nil
	}
	for _, kv := range kvs {
		if size+len(kv[0])+len(kv[1]) > copyBatchBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		ops, size = append(ops, clientv3.OpPut(kv[0], kv[1])), size+len(kv[0])+len(kv[1])
		if len(ops) == copyBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// copiedState is st of thread from as thread to's: its checkpoints' and
// its metadata's thread ids are to.
func copiedState(st ThreadState, from, to string) ThreadState {
	md := map[string]any{}
	if raw, err := json.Marshal(st.Metadata); err == nil && st.Metadata != nil {
		_ = json.Unmarshal([]byte(strings.ReplaceAll(string(raw), from, to)), &md)
	}
	md["thread_id"] = to
	st.Metadata = md
	st.Checkpoint = withThreadID(st.Checkpoint, to)
	st.ParentCheckpoint = withThreadID(st.ParentCheckpoint, to)
	return st
}

// withThreadID is checkpoint reference cp with thread_id to; nil stays nil.
func withThreadID(cp any, to string) any {
	m, ok := cp.(map[string]any)
	if !ok {
		return cp
	}
	out := make(map[string]any, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	out["thread_id"] = to
	return out
}

// A copy of a thread writes its checkpoints and history under the new id
// in several transactions before the one that creates the thread. A
// server that crashes between them would leave those keys under an id no
// thread has, which nothing reads and nothing deletes. So a copy first
// writes a mark naming the new id, and the transaction that creates the
// thread deletes it: a mark older than copyOrphanAge names a copy that
// was interrupted, and the next copy, on any member, deletes its keys.

// copyOrphanAge is how old a copy's mark must be, by the clock of the
// member that sweeps, before its keys are taken for a crashed copy's:
// longer than a copy runs. A copy swept while it still runs (a clock far
// ahead, a request timeout past it) fails, as its writes compare its mark.
const copyOrphanAge = 10 * time.Minute

// maxCopySweep bounds the marks one copy examines.
const maxCopySweep = 16

// afterCopyCheckpoints, when set (by tests), is called once a copy to
// thread id wrote its checkpoints.
var afterCopyCheckpoints func(id string)

// copyMark is the value of a copy's mark.
type copyMark struct {
	From      string    `json:"from"`
	StartedAt time.Time `json:"started_at"`
}

// markCopy writes the mark of the copy of thread from to thread to, and
// answers the compare that holds while the mark is as written.
func (s *server) markCopy(ctx context.Context, sp keyspace.Space, from, to string) (clientv3.Cmp, error) {
	raw, _ := json.Marshal(copyMark{From: from, StartedAt: s.now()})
	key := sp.AgentThreadCopy(to)
	put, err := s.cfg.Etcd.Put(ctx, key, string(raw))
	if err != nil {
		return clientv3.Cmp{}, etcdError("marking the copy", err)
	}
	return clientv3.Compare(clientv3.ModRevision(key), "=", put.Header.Revision), nil
}

// sweepCopies deletes the keys of copies interrupted by a crash: those
// whose marks are older than copyOrphanAge, when no thread of their id
// exists, each with its mark in one transaction (a mark whose thread
// exists is deleted alone). It answers how many it
// deleted; an error is left for the next sweep (the copy goes on).
func (s *server) sweepCopies(ctx context.Context, sp keyspace.Space) int {
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentThreadCopies(), clientv3.WithPrefix(), clientv3.WithLimit(maxCopySweep))
	if err != nil {
		return 0
	}
	swept := 0
	for _, kv := range resp.Kvs {
		var m copyMark
		if json.Unmarshal(kv.Value, &m) != nil || s.now().Sub(m.StartedAt) < copyOrphanAge {
			continue // young, or not a mark this server wrote: left alone
		}
		id := strings.TrimPrefix(string(kv.Key), sp.AgentThreadCopies())
		// A mark whose thread exists (never left by a copy) goes alone.
		r, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).Then(
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(sp.AgentThread(id)), "=", 0)},
				[]clientv3.Op{clientv3.OpDelete(sp.Checkpoints(id), clientv3.WithPrefix()), clientv3.OpDelete(sp.AgentThreadHistory(id), clientv3.WithPrefix())}, nil),
			clientv3.OpDelete(string(kv.Key)),
		).Commit()
		if err == nil && r.Succeeded {
			swept++
		}
	}
	return swept
}
