package agentserver

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runGrace is how long a run's record may be without its task: createRun
// writes the record, then submits the task. A record not ended whose task
// is missing past it (never submitted, or dropped by the queue's
// retention) has ended.
const runGrace = 5 * time.Minute

// withTaskStatus sets the status of the runs not ended from their tasks':
// pending until a runtime claims it, running while one holds it, error
// when it died without an outcome, interrupted when cancelled. A run
// whose task has ended (or is gone, see runGrace) is settled: its record
// written ended, revs[i] then its new revision, and its thread's next
// enqueued run admitted (unless ctx is admitNext's or takeThread's).
func (s *server) withTaskStatus(ctx context.Context, runs []*runRecord, revs []int64) error {
	var ids []string
	for _, r := range runs {
		if !r.Ended && !r.Queued {
			ids = append(ids, r.RunID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	q, err := s.queueOf(ctx)
	if err != nil {
		return err
	}
	defer closeQueue(q)
	ts, err := q.GetMany(ctx, ids)
	if err != nil {
		return etcdError("reading the runs' tasks", err)
	}
	by := map[string]*queue.Task{}
	for _, t := range ts {
		by[t.ID] = t
	}
	var settled []string
	for i, r := range runs {
		if r.Ended || r.Queued {
			continue
		}
		t := by[r.RunID]
		switch {
		case t != nil:
			r.Status = statusOfTask(t)
			if r.Status == "error" && r.Error == nil {
				r.Error = map[string]any{"error": "RunError", "message": t.LastError}
			}
			if !finished(t) {
				continue
			}
		case s.now().Sub(admitted(r)) > runGrace:
			// Its creator died before submitting its task: what it stopped
			// is stopped before it ends (else a stopped run, written ended,
			// would run on beside the thread's next). Inside a stop or an
			// admission (admittingKey) the caller stops what is in its way.
			if ctx.Value(admittingKey{}) == nil {
				if err := s.finishStops(ctx, *r); err != nil {
					return err
				}
			}
			r.Status, r.Error = "error", map[string]any{"error": "RunError", "message": "the run's task is gone: it was never submitted, or it ended long ago without an outcome"}
		default:
			// Admitted without its task yet: its creator is about to submit
			// it, or died first (the batch read above found its task missing). Any read of it finishes what the creator
			// began (the runs it stopped stopped, then its task submitted):
			// a stopped run never runs on for want of a join of the new one.
			// A failure is logged, not answered: the next read tries again.
			if ctx.Value(admittingKey{}) == nil && s.taskDue(*r) {
				if err := s.submitMissingTask(ctx, q, *r); err != nil {
					slog.Default().Warn("agentserver: submitting the task of a run admitted without it", "run", r.RunID, "err", err)
				}
			}
			continue
		}
		rev, err := s.settle(ctx, r, revs[i])
		if err != nil {
			return err
		}
		revs[i] = rev
		settled = append(settled, r.ThreadID)
	}
	if ctx.Value(admittingKey{}) == nil {
		done := map[string]bool{}
		for _, th := range settled { // an admitted run ended: the next enqueued one's turn
			if !done[th] {
				done[th] = true
				s.admitNextLogged(ctx, th)
			}
		}
	}
	return nil
}

// admitted is when r's task was to be submitted: when it was admitted
// from the thread's queue, else when it was created.
func admitted(r *runRecord) time.Time {
	if !r.AdmittedAt.IsZero() {
		return r.AdmittedAt
	}
	return r.CreatedAt
}

func finished(t *queue.Task) bool {
	switch t.CurrentStatus {
	case queue.Dead, queue.Cancelled, queue.Succeeded:
		return true
	}
	return false
}

// settle writes run r ended with its status, if its record is still at
// rev, and puts its thread back from busy (to error when r ended in one,
// else idle) unless another run of the thread is still active. It
// returns the record's revision after; another writer's change leaves the
// record to it (and r as read).
func (s *server) settle(ctx context.Context, r *runRecord, rev int64) (int64, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return 0, err
	}
	ended := *r
	ended.Ended, ended.UpdatedAt = true, s.now()
	rraw, _ := json.Marshal(ended)
	rkey := sp.AgentRun(r.ThreadID, r.RunID)
	for range maxAttempts {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(rkey), "=", rev)}
		ops := []clientv3.Op{clientv3.OpPut(rkey, string(rraw)), clientv3.OpDelete(sp.AgentActiveRun(r.ThreadID, r.RunID))}
		th, trev, err := s.getThread(ctx, r.ThreadID)
		if err != nil && !isNotFound(err) {
			return 0, err
		}
		if err == nil && th.Status == "busy" {
			other, err := s.otherActive(ctx, r.ThreadID, r.RunID)
			if err != nil {
				return 0, err
			}
			// The thread is written even when it stays busy: two settles (or
			// a settle and an outcome) that each see the other's run active
			// then conflict, and the one retried sees it ended.
			th.UpdatedAt = ended.UpdatedAt
			if !other {
				th.Status = "idle"
				if r.Status == "error" {
					th.Status = "error"
				}
			}
			traw, _ := json.Marshal(th)
			ops = append(ops, clientv3.OpPut(sp.AgentThread(r.ThreadID), string(traw)))
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(sp.AgentThread(r.ThreadID)), "=", trev))
		}
		resp, err := s.cfg.Etcd.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(rkey)).Commit()
		if err != nil {
			return 0, etcdError("ending the run", err)
		}
		if resp.Succeeded {
			*r = ended
			return resp.Header.Revision, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].ModRevision != rev { // another wrote or deleted it
			return rev, nil
		}
	}
	return 0, errRaced("the thread")
}

// otherActive says whether a run of thread other than id has not ended,
// as the index of its active runs says: its keys, and the records of
// those other than id (an index key whose record is gone or ended, which
// no write should leave, does not keep the thread busy).
func (s *server) otherActive(ctx context.Context, thread, id string) (bool, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return false, err
	}
	if err := s.ensureRunIndex(ctx, sp); err != nil {
		return false, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentActiveRuns(thread), activeIndexOpts()...)
	if err != nil {
		return false, etcdError("reading the thread's active runs", err)
	}
	return s.othersNotEnded(ctx, sp, thread, id, resp.Kvs)
}

// activeIndexOpts read a thread's index of active runs: its keys, at most
// maxStopped+1.
func activeIndexOpts() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(maxStopped + 1)}
}

// othersNotEnded says whether a run of thread other than id, among the
// keys idx of its index of active runs, has not ended: it reads their
// records (none when idx holds id's alone).
func (s *server) othersNotEnded(ctx context.Context, sp keyspace.Space, thread, id string, idx []*mvccpb.KeyValue) (bool, error) {
	var gets []clientv3.Op
	for _, kv := range idx {
		if other := idOf(kv.Key); other != id {
			gets = append(gets, clientv3.OpGet(sp.AgentRun(thread, other)))
		}
	}
	if len(gets) == 0 {
		return false, nil
	}
	recs, err := s.cfg.Etcd.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return false, etcdError("reading the thread's active runs", err)
	}
	for _, r := range recs.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			var rec runRecord
			if err := json.Unmarshal(kv.Value, &rec); err != nil {
				return false, undecodable("run", idOf(kv.Key), err)
			}
			if !rec.Ended {
				return true, nil
			}
		}
	}
	return false, nil
}

// statusOfTask is the status of a run whose task is t.
func statusOfTask(t *queue.Task) string {
	switch t.CurrentStatus {
	case queue.Running, queue.Sleeping, queue.Waiting:
		return "running"
	case queue.Dead:
		return "error"
	case queue.Cancelled:
		return "interrupted"
	case queue.Succeeded: // ended without an outcome written: the runtime's result says
		var res struct {
			Status string `json:"status"`
		}
		if json.Unmarshal(t.Result, &res) == nil && res.Status != "" {
			return res.Status
		}
		return "success"
	}
	return "pending"
}
