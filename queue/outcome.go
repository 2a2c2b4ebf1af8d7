package queue

import (
	"context"
	"encoding/json"
	"time"

	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// acker writes outcomes in batches: one transaction, one nested transaction
// per task, each fenced by the task's claim. It ends when outcomes is closed
// and everything in it is written.
func (w *Worker) acker(outcomes <-chan outcome) {
	batch := make([]outcome, 0, 100)
	for o := range outcomes {
		batch = append(batch[:0], o)
	more:
		for len(batch) < 100 {
			select {
			case o, ok := <-outcomes:
				if !ok {
					break more
				}
				batch = append(batch, o)
			default:
				break more
			}
		}
		w.commit(batch)
	}
}

func (w *Worker) commit(batch []outcome) {
	now := time.Now().UTC()
	var ops []clientv3.Op
	var kept []outcome
	size := 0
	for _, o := range batch {
		if o.kind == Cancelled {
			continue // the canceller or the lease took the claim away
		}
		op, n := w.ackOp(o, now)
		if len(ops) > 0 && size+n > maxRequestBytes {
			w.write(ops, kept)
			ops, kept, size = nil, nil, 0
		}
		ops, kept, size = append(ops, op), append(kept, o), size+n
	}
	w.write(ops, kept)
}

// write records outcomes in one request, retrying a few times; a request
// that keeps failing is split in two, and an outcome that cannot be written
// at all is handed back, so its task does not stay claimed under a live
// lease.
func (w *Worker) write(ops []clientv3.Op, kept []outcome) {
	if len(ops) == 0 {
		return
	}
	var resp *clientv3.TxnResponse
	var err error
	for try := 0; try < 3; try++ {
		ctx, cancel := context.WithTimeout(w.lease.Context(), 10*time.Second)
		began := time.Now()
		resp, err = w.cli.Txn(ctx).Then(ops...).Commit()
		metrics.ObserveTxn("ack", began)
		cancel()
		if err == nil || w.lease.Err() != nil {
			break
		}
		time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
	}
	if err != nil {
		if w.lease.Err() != nil {
			return // the claims went with the lease; others take the tasks
		}
		if len(ops) > 1 {
			h := len(ops) / 2
			w.write(ops[:h], kept[:h])
			w.write(ops[h:], kept[h:])
			return
		}
		if kept[0].kind == Pending {
			// Handing back failed too: keep trying while the lease lives,
			// or the task stays claimed (RUNNING) until this worker ends.
			for try := 0; try < 30 && w.lease.Err() == nil; try++ {
				time.Sleep(time.Second)
				ctx, cancel := context.WithTimeout(w.lease.Context(), 10*time.Second)
				_, err = w.cli.Txn(ctx).Then(ops...).Commit()
				cancel()
				if err == nil {
					w.handedBack.Add(1)
					return
				}
			}
			w.logger.Error("queue: could not hand a task back; it is claimable again when this worker's lease ends", "task", kept[0].c.task.ID, "err", err)
			return
		}
		w.logger.Warn("queue: could not record a task's outcome; handing it back", "task", kept[0].c.task.ID, "err", err)
		back := kept[0]
		back.kind = Pending
		back.deferred = ""
		op, _ := w.ackOp(back, time.Now().UTC())
		w.write([]clientv3.Op{op}, []outcome{back})
		return
	}
	for i, r := range resp.Responses {
		if !r.GetResponseTxn().Succeeded {
			w.fenced.Add(1)
			w.logger.Warn("queue: outcome refused: the claim was lost", "task", kept[i].c.task.ID, "attempt", kept[i].c.task.Attempt)
			continue
		}
		t := kept[i].c.task
		switch kept[i].kind {
		case Succeeded:
			w.succeeded.Add(1)
			metrics.TasksSucceeded.WithLabelValues(t.Queue, t.Type).Inc()
		case Retrying:
			w.retried.Add(1)
			metrics.TasksFailed.WithLabelValues(t.Queue, t.Type).Inc()
			metrics.TasksRetried.WithLabelValues(t.Queue, t.Type).Inc()
		case Dead:
			w.dead.Add(1)
			metrics.TasksFailed.WithLabelValues(t.Queue, t.Type).Inc()
			metrics.TasksDead.WithLabelValues(t.Queue, t.Type).Inc()
		case Pending:
			w.handedBack.Add(1)
			if kept[i].deferred != "" {
				metrics.TasksDeferred.WithLabelValues(t.Queue, t.Type, kept[i].deferred).Inc()
			}
		}
	}
}

// retryValue is what a retry key holds: where the task goes back to.
type retryValue struct {
	PendingKey string `json:"p"`
	Attempts   int    `json:"a"`
}

// ackOp is the fenced nested transaction that records one outcome.
func (w *Worker) ackOp(o outcome, now time.Time) (clientv3.Op, int) {
	c, t := o.c, o.c.task
	fence := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.claimKey), "=", c.token)}
	if o.kind == Pending && o.deferred != "" { // deferred by flow control: back after the delay, uncharged
		// Each deferral in a row doubles the delay (up to 16x, 30 s at
		// most), so a backlog held off by a quota or breaker does not keep
		// the claims busy; only the first one goes into the history.
		delay := min(o.delay<<min(t.Deferrals, 4), max(o.delay, 30*time.Second))
		if t.Deferrals == 0 {
			t.Transitions = appendTransition(t.Transitions, Transition{Status: Pending, At: now, Attempt: t.Attempt, Worker: w.worker, Error: "deferred: " + o.deferred})
		}
		t.Deferrals++
		t.CurrentStatus, t.ScheduledAt = Pending, now.Add(delay)
		t.Attempt--
		rv, _ := json.Marshal(retryValue{PendingKey: c.pendingKey, Attempts: t.Attempt})
		rec, _ := json.Marshal(t)
		return clientv3.OpTxn(fence, []clientv3.Op{clientv3.OpDelete(c.claimKey), clientv3.OpDelete(c.pendingKey),
			clientv3.OpPut(w.client.retryKey(t), string(rv)), clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec))}, nil), len(rec) + 500
	}
	if o.kind == Pending { // handed back: the attempt does not count
		return clientv3.OpTxn(fence, []clientv3.Op{clientv3.OpDelete(c.claimKey), clientv3.OpPut(c.pendingKey, encodePending(t.Attempt-1, false))}, nil), 300
	}
	t.Transitions = appendLost(t.Transitions, t.Attempt, c.claimedAt)
	t.Transitions = appendTransition(t.Transitions, Transition{Status: Running, At: c.claimedAt, Attempt: t.Attempt, Worker: w.worker})
	ops := []clientv3.Op{clientv3.OpDelete(c.claimKey), clientv3.OpDelete(c.pendingKey)}
	switch o.kind {
	case Succeeded:
		t.CurrentStatus, t.Result, t.LastError, t.RetriesAttempted = Succeeded, o.result, "", t.Attempt-1
		ops = append(ops, clientv3.OpPut(w.client.doneKey(t.Queue, Succeeded, now, t.ID), ""))
	case Retrying:
		t.CurrentStatus, t.RetriesAttempted, t.LastError = Retrying, t.Attempt-1, truncate(o.err.Error(), 4096)
		t.ScheduledAt = now.Add(o.delay)
		rv, _ := json.Marshal(retryValue{PendingKey: c.pendingKey, Attempts: t.Attempt})
		ops = append(ops, clientv3.OpPut(w.client.retryKey(t), string(rv)))
	case Dead:
		t.CurrentStatus, t.RetriesAttempted, t.LastError = Dead, t.Attempt-1, truncate(o.err.Error(), 4096)
		ops = append(ops, clientv3.OpPut(w.keys.QueueDead(t.Queue)+t.ID, ""))
	}
	tr := Transition{Status: t.CurrentStatus, At: now, Attempt: t.Attempt, Worker: w.worker}
	if o.err != nil {
		tr.Error = truncate(o.err.Error(), 4096)
	}
	t.Transitions = appendTransition(t.Transitions, tr)
	t.Token = c.token
	rec, _ := json.Marshal(t)
	ops = append(ops, clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec)))
	return clientv3.OpTxn(fence, ops, nil), len(rec) + 500
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
