package agentserver

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxPrune bounds the threads of one prune.
const maxPrune = 1000

type pruneInput struct {
	Body struct {
		ThreadIDs []string `json:"thread_ids" maxItems:"1000" doc:"The threads to prune."`
		Strategy  string   `json:"strategy,omitempty" enum:"delete,keep_latest" doc:"delete (the default): the threads, as a delete does; keep_latest: their checkpoints and history but the latest."`
	}
}

// pruneThread prunes thread id with strategy; false when there was
// nothing to prune (no such thread, or one busy with a run, whose
// checkpoints keep_latest leaves alone).
func (s *server) pruneThread(ctx context.Context, id, strategy string) (bool, error) {
	if strategy != "keep_latest" {
		err := s.deleteThread(ctx, id)
		if isNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}
	for range maxAttempts {
		pruned, raced, err := s.pruneLatest(ctx, id)
		if err != nil || !raced {
			return pruned, err
		}
	}
	return false, errRaced("the thread") // changed under every attempt: left as it is
}

// beforePruneCommit, when set (by tests), is called once a keep_latest
// prune has read what it keeps, before it writes.
var beforePruneCommit func()

// pruneLatest is one attempt of a keep_latest prune of thread id: raced
// when the thread, a checkpoint it would delete or the state record it
// rewrites changed since it read them (nothing pruned; read again).
func (s *server) pruneLatest(ctx context.Context, id string) (pruned, raced bool, err error) {
	sp, err := s.space(ctx)
	if err != nil {
		return false, false, err
	}
	t, trev, err := s.getThread(ctx, id)
	if isNotFound(err) || (err == nil && t.Status == "busy") {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	h, err := s.readHistory(ctx, sp, id, 1, false)
	if err != nil {
		return false, false, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.Checkpoints(id), clientv3.WithPrefix())
	if err != nil {
		return false, false, etcdError("reading the thread's checkpoints", err)
	}
	// Every change compares the thread: a run admitted since (it marks
	// the thread busy) makes the prune fail, and a prune that lost a race
	// prunes nothing. A state record of the previous layout, rewritten
	// with its newest state alone, is compared too: a metadata patch of
	// it since is kept, not undone.
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(sp.AgentThread(id)), "=", trev)}
	if h.legacy && h.recKV != nil {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(h.recKV.Key)), "=", h.recKV.ModRevision))
	}
	ops := prunedHistory(sp, id, h)
	cmps, ops = prunedCheckpoints(sp, id, resp.Kvs, cmps, ops)
	if beforePruneCommit != nil {
		beforePruneCommit()
	}
	for lo := 0; lo < len(ops); lo += copyBatch { // the first batch's compares guard the prune, the latest checkpoints' keys the rest
		hi := min(lo+copyBatch, len(ops))
		var batch []clientv3.Cmp
		if lo == 0 {
			batch = append(batch, cmps[0])
		}
		for _, op := range ops[lo:hi] {
			for _, c := range cmps[1:] {
				if bytes.Equal(c.KeyBytes(), op.KeyBytes()) {
					batch = append(batch, c)
				}
			}
		}
		r, err := s.cfg.Etcd.Txn(ctx).If(batch...).Then(ops[lo:hi]...).Commit()
		if err != nil {
			return false, false, etcdError("pruning the thread", err)
		}
		if !r.Succeeded && lo == 0 {
			return false, true, nil
		}
	}
	return true, false, nil
}

// prunedCheckpoints adds to cmps and ops the deletes of thread id's
// checkpoints (kvs, its checkpoint keys) but each namespace's head, with
// the writes of those, each compared at the revision read.
func prunedCheckpoints(sp keyspace.Space, id string, kvs []*mvccpb.KeyValue, cmps []clientv3.Cmp, ops []clientv3.Op) ([]clientv3.Cmp, []clientv3.Op) {
	heads := map[string]string{} // checkpoint namespace's key name: its head's id
	for _, kv := range kvs {
		if ns, ok := sp.CheckpointNSOfKey(id, string(kv.Key)); ok && string(kv.Key) == sp.CheckpointHead(id, keyspace.CheckpointNSName(ns)) {
			heads[keyspace.CheckpointNSName(ns)] = string(kv.Value)
		}
	}
	for _, kv := range kvs {
		ns, ok := sp.CheckpointNSOfKey(id, string(kv.Key))
		if !ok {
			continue
		}
		name := keyspace.CheckpointNSName(ns)
		head, key := heads[name], string(kv.Key)
		old := strings.HasPrefix(key, sp.CheckpointKeys(id, name)) && key != sp.CheckpointKey(id, name, head) ||
			strings.HasPrefix(key, sp.CheckpointBase(id, name)+"writes/") && !keptWrites(key, sp.CheckpointWrites(id, name, head))
		if old {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision))
			ops = append(ops, clientv3.OpDelete(key))
		}
	}
	return cmps, ops
}

// prunedHistory are the operations that keep only the newest state of
// thread id's history h (read with its newest state): the older states'
// keys deleted, or a legacy record converted with that state alone.
func prunedHistory(sp keyspace.Space, id string, h storedHistory) []clientv3.Op {
	if h.legacy {
		raw, _ := json.Marshal(h.rec.State)
		return append(historyWhole(sp, id, h.states[:min(len(h.states), 1)], h.gap), clientv3.OpPut(sp.AgentThreadState(id), recordJSON(raw)))
	}
	if len(h.kvs) == 0 {
		return nil
	}
	older := sp.AgentThreadHistoryState(id, historyPos(h.kvs[0].Key)+1)
	return []clientv3.Op{clientv3.OpDelete(older, clientv3.WithRange(historyEnd(sp, id)))}
}

// keptWrites reports whether key holds pending writes of the latest
// checkpoint, whose writes are the one key latest (or keys under it).
func keptWrites(key, latest string) bool {
	return key == latest || strings.HasPrefix(key, latest+"/")
}

// patchStateMetadata merges metadata into that of thread id's latest
// checkpoint, in the checkpoint store and in its state as served.
func (s *server) patchStateMetadata(ctx context.Context, id string, metadata map[string]any) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	for range maxAttempts {
		h, err := s.readHistory(ctx, sp, id, 1, true)
		if err != nil {
			return err
		}
		cid := checkpointIDOf(h.rec.State)
		if cid == "" || h.recKV == nil {
			return huma.NewError(http.StatusNotFound, "Thread "+id+" has no checkpoint: run it once first")
		}
		ckey := sp.CheckpointKey(id, keyspace.CheckpointNSName(""), cid)
		cp, err := s.cfg.Etcd.Get(ctx, ckey)
		if err != nil {
			return etcdError("reading the thread's checkpoint", err)
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(sp.AgentThreadState(id)), "=", h.recKV.ModRevision)}
		var ops []clientv3.Op
		if len(cp.Kvs) == 1 {
			d := json.NewDecoder(bytes.NewReader(cp.Kvs[0].Value))
			d.UseNumber()
			var v map[string]any
			if err := d.Decode(&v); err != nil {
				return undecodable("checkpoint", cid, err)
			}
			v["metadata"] = merged(v["metadata"], metadata)
			raw, _ := json.Marshal(v)
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(ckey), "=", cp.Kvs[0].ModRevision))
			ops = append(ops, clientv3.OpPut(ckey, string(raw)))
		}
		h.rec.State.Metadata = merged(h.rec.State.Metadata, metadata)
		head := len(h.states) > 0 && checkpointIDOf(h.states[0]) == cid
		if head {
			h.states[0].Metadata = h.rec.State.Metadata
		}
		switch {
		case h.legacy:
			ops = append(ops, historyWhole(sp, id, h.states, h.gap)...)
		case head:
			raw, _ := json.Marshal(h.states[0])
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(h.kvs[0].Key)), "=", h.kvs[0].ModRevision))
			ops = append(ops, clientv3.OpPut(string(h.kvs[0].Key), string(raw)))
		}
		raw, _ := json.Marshal(h.rec.State)
		ops = append(ops, clientv3.OpPut(sp.AgentThreadState(id), recordJSON(raw)))
		r, err := s.cfg.Etcd.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return etcdError("patching the state's metadata", err)
		}
		if r.Succeeded {
			return nil
		}
	}
	return errRaced("the thread's state")
}

// merged is object old with patch's keys set.
func merged(old any, patch map[string]any) map[string]any {
	out := map[string]any{}
	if m, ok := old.(map[string]any); ok {
		for k, v := range m {
			out[k] = v
		}
	}
	for k, v := range patch {
		out[k] = v
	}
	return out
}

func (s *server) pruneRoutes(api huma.API) {
	tags := []string{tagThreads}
	huma.Register(api, huma.Operation{
		OperationID: "lg-prune-threads", Method: http.MethodPost, Path: "/threads/prune", Tags: tags,
		Summary:     "Prune threads (LangGraph)",
		Description: "delete deletes them; keep_latest keeps each thread and its latest checkpoint, dropping the older ones (a thread busy with a run is left alone). Answers how many were pruned.",
		Errors:      []int{http.StatusBadRequest},
	}, func(ctx context.Context, in *pruneInput) (*struct {
		Body struct {
			PrunedCount int `json:"pruned_count"`
		}
	}, error) {
		ids := make([]string, len(in.Body.ThreadIDs))
		for i, id := range in.Body.ThreadIDs {
			if !isUUID(id) {
				return nil, badInput("body.thread_ids["+itoa(i)+"]", id, "must be a UUID")
			}
			ids[i] = strings.ToLower(id)
		}
		out := &struct {
			Body struct {
				PrunedCount int `json:"pruned_count"`
			}
		}{}
		for _, id := range ids[:min(len(ids), maxPrune)] {
			ok, err := s.pruneThread(ctx, id, in.Body.Strategy)
			if err != nil {
				return nil, err
			}
			if ok {
				out.Body.PrunedCount++
			}
		}
		return out, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-patch-thread-state", Method: http.MethodPatch, Path: "/threads/{thread_id}/state", Tags: tags,
		Summary: "Merge metadata into a thread's latest checkpoint (LangGraph)", DefaultStatus: http.StatusNoContent,
		Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		Body     struct {
			Metadata map[string]any `json:"metadata" doc:"Keys to merge into the latest checkpoint's metadata."`
		}
	}) (*struct{}, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		return nil, s.patchStateMetadata(ctx, id, in.Body.Metadata)
	})
}
