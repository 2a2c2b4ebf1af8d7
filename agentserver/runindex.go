package agentserver

import (
	"context"
	"encoding/json"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// backfillPage is how many run records one step of the backfill reads:
// its transaction compares and indexes at most that many, within
// maxTxnOps.
const backfillPage = 100

// ensureRunIndex makes sure every run of sp stored before the index of
// active runs existed (by an earlier version, which wrote no index key)
// has its index key, before anything reads the index: else a run active
// then would be invisible to a create, and a second run admitted on its
// thread. The first read in a namespace backfills it, once: every run
// record is read a page at a time and each not ended gets its key, in a
// transaction that compares the record's revision (a run that ends
// meanwhile is read again), then AgentActiveRunsIndexed is written. A
// server then knows the namespace done and reads nothing more for it.
func (s *server) ensureRunIndex(ctx context.Context, sp keyspace.Space) error {
	if _, ok := s.indexed.Load(sp.AgentRuns("")); ok {
		return nil
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentActiveRunsIndexed(), clientv3.WithKeysOnly())
	if err != nil {
		return etcdError("reading the index of active runs", err)
	}
	if len(resp.Kvs) == 0 {
		if err := s.backfillRunIndex(ctx, sp); err != nil {
			return err
		}
		if _, err := s.cfg.Etcd.Put(ctx, sp.AgentActiveRunsIndexed(), ""); err != nil {
			return etcdError("writing the index of active runs", err)
		}
	}
	s.indexed.Store(sp.AgentRuns(""), true)
	return nil
}

// backfillRunIndex writes the index key of every run of sp not ended:
// see ensureRunIndex. Its writes are idempotent; a page whose runs
// changed meanwhile is read again, within maxAttempts.
func (s *server) backfillRunIndex(ctx context.Context, sp keyspace.Space) error {
	from, end := sp.AgentRuns(""), clientv3.GetPrefixRangeEnd(sp.AgentRuns(""))
	for attempt := 0; attempt < maxAttempts; {
		page, err := s.cfg.Etcd.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(backfillPage))
		if err != nil {
			return etcdError("reading the runs to index", err)
		}
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, kv := range page.Kvs {
			var r struct {
				RunID    string `json:"run_id"`
				ThreadID string `json:"thread_id"`
				Ended    bool   `json:"ended"`
			}
			if json.Unmarshal(kv.Value, &r) != nil || r.Ended || r.RunID == "" || r.ThreadID == "" {
				continue // one that does not decode is refused by every read of it
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
			ops = append(ops, clientv3.OpPut(sp.AgentActiveRun(r.ThreadID, r.RunID), ""))
		}
		if len(ops) > 0 {
			resp, err := s.cfg.Etcd.Txn(ctx).If(cmps...).Then(ops...).Commit()
			if err != nil {
				return etcdError("indexing the active runs", err)
			}
			if !resp.Succeeded { // a run of the page changed: read it again
				attempt++
				continue
			}
		}
		if !page.More || len(page.Kvs) == 0 {
			return nil
		}
		from, attempt = string(page.Kvs[len(page.Kvs)-1].Key)+"\x00", 0
	}
	return errRaced("the runs to index")
}
