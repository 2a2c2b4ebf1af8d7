package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RunsQueue is the queue of the namespace that carries runs: each run is
// one task of it, whose id is the run's id and whose type is the graph's
// name; a runtime claims them as any worker.
const RunsQueue = "langgraph"

// Run is one execution of an assistant's graph on a thread. Its fields and
// their JSON are LangGraph's.
type Run struct {
	RunID             string         `json:"run_id"`
	ThreadID          string         `json:"thread_id"`
	AssistantID       string         `json:"assistant_id"`
	CreatedAt         time.Time      `json:"created_at"`
	UpdatedAt         time.Time      `json:"updated_at"`
	Status            string         `json:"status" enum:"pending,running,error,success,timeout,interrupted"`
	Metadata          map[string]any `json:"metadata"`
	Kwargs            map[string]any `json:"kwargs"`
	MultitaskStrategy string         `json:"multitask_strategy"`
}

// runRecord is a run as stored: the run and what its runtime reported.
type runRecord struct {
	Run
	GraphID string `json:"graph_id"`
	// Ended is set by the runtime's outcome; until then the status
	// follows the run's queue task.
	Ended bool `json:"ended,omitempty"`
	// Error is the graph's error ({error, message}) when it ended in one.
	Error any `json:"error,omitempty"`
	// Queued is set on an enqueued run that waits for the thread's active
	// run to end: it has no task yet until it is admitted (AdmittedAt).
	Queued     bool      `json:"queued,omitempty"`
	AdmittedAt time.Time `json:"admitted_at,omitzero"`
	// Params are the parameters of the run's task, and DueAt when it is
	// due (a delayed run): whoever finds the run admitted without its
	// task (its creator died before submitting it) submits it from them.
	Params json.RawMessage `json:"params,omitempty"`
	DueAt  time.Time       `json:"due_at,omitzero"`
	// Stops are the runs this one stopped (interrupt, rollback: with
	// RollbackStops their checkpoints are deleted), written ended in the
	// transaction that admitted it: finishStops stops them before its
	// task is submitted.
	Stops         []stopRef `json:"stops,omitempty"`
	RollbackStops bool      `json:"rollback_stops,omitempty"`
}

// ThreadState is a thread's state at a checkpoint, as LangGraph answers
// it (and as the runtime reports it from the checkpoint store).
type ThreadState struct {
	Values           any            `json:"values"`
	Next             []string       `json:"next"`
	Tasks            []any          `json:"tasks"`
	Metadata         map[string]any `json:"metadata" required:"false"`
	CreatedAt        *string        `json:"created_at" required:"false"`
	Checkpoint       any            `json:"checkpoint" required:"false"`
	ParentCheckpoint any            `json:"parent_checkpoint" required:"false"`
	Interrupts       []any          `json:"interrupts,omitempty"`
}

// stateRecord is what the runtime of a thread's last run reported: its
// state. Its history is apart, one key per state (see readHistory); a
// record of the previous layout holds it too.
type stateRecord struct {
	State ThreadState `json:"state"`
	// History: the history, newest first, of a record of the previous
	// layout; never written now.
	History []ThreadState `json:"history,omitempty"`
	// Gap: of a record of the previous layout, that a state update was
	// stored on a checkpoint its history does not hold (now the history's
	// gap key, keyspace.AgentThreadHistoryGap).
	Gap bool `json:"gap,omitempty"`
}

// errRunExists: a run of that id is stored already (a cron's fire made
// again finds the run it made); a 409.
type errRunExists struct{ id string }

func (e errRunExists) Error() string  { return "Run " + e.id + " already exists" }
func (e errRunExists) GetStatus() int { return http.StatusConflict }

func errRunNotFound(id string) error {
	return huma.NewError(http.StatusNotFound, fmt.Sprintf("Run with ID %s not found", id))
}

// queueOf is a queue client of the request's namespace; close it after.
func (s *server) queueOf(ctx context.Context) (*queue.Client, error) {
	q, err := queue.NewClient(s.cfg.Etcd, s.cfg.Namespace(ctx))
	if err != nil {
		return nil, huma.NewError(http.StatusInternalServerError, "agentserver: "+err.Error())
	}
	return q, nil
}

func closeQueue(q *queue.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = q.Close(ctx)
}

// runTask is what a runtime reads from a run's queue task.
type runTask struct {
	Run       Run    `json:"run"`
	GraphID   string `json:"graph_id"`
	Config    any    `json:"assistant_config"`
	Context   any    `json:"assistant_context"`
	Temporary bool   `json:"temporary,omitempty"`
}

// createRun stores run r on its thread and admits it, or queues it
// behind the thread's active run (enqueue), or stops that run first
// (interrupt, rollback), or refuses it while the thread has one (reject,
// 409): see multitask.go. The admission is one transaction that compares
// the thread's revision with what was read beside its runs.
func (s *server) createRun(ctx context.Context, r runRecord, a assistantRecord, temporary bool, delay time.Duration) (Run, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Run{}, err
	}
	params, _ := json.Marshal(runTask{Run: r.Run, GraphID: a.GraphID, Config: a.Config, Context: a.Context, Temporary: temporary})
	for range maxAttempts {
		t, rev, err := s.getThread(ctx, r.ThreadID) // first: see takeThread
		if err != nil {
			return Run{}, err
		}
		runs, revs, err := s.threadRuns(ctx, r.ThreadID, nil)
		if err != nil {
			return Run{}, err
		}
		if err := s.refuseMade(ctx, sp, r); err != nil {
			return Run{}, err
		}
		if onlyQueued(runs) { // stranded: the end of the run before them admitted none
			if err := s.admitNext(ctx, r.ThreadID); err != nil {
				return Run{}, err
			}
			continue
		}
		active, cmps, ops := s.stopPlan(sp, r, runs, revs)
		rec := r
		rec.Params = params
		if delay > 0 {
			rec.DueAt = s.now().Add(delay)
		}
		switch {
		case len(active) == 0:
			cmps, ops = nil, nil
		case r.MultitaskStrategy == "reject":
			return Run{}, huma.NewError(http.StatusConflict, fmt.Sprintf("Thread %s is busy with run %s: multitask_strategy is reject", r.ThreadID, active[0].RunID))
		case len(active) > maxStopped || len(ops)+writeRunOps > maxTxnOps || len(cmps)+writeRunOps > maxTxnOps:
			return Run{}, huma.NewError(http.StatusConflict, fmt.Sprintf("Thread %s has %d runs not ended, more than the %d one run may stop or queue behind", r.ThreadID, len(active), maxStopped))
		case r.MultitaskStrategy == "enqueue":
			rec.Queued = true
			cmps, ops = nil, nil
		default: // interrupt, rollback: stopped once the transaction that admits rec commits
			for _, o := range active {
				rec.Stops = append(rec.Stops, stopRef{RunID: o.RunID, GraphID: o.GraphID, Queued: o.Queued})
			}
			rec.RollbackStops = r.MultitaskStrategy == "rollback"
		}
		before, ok, err := s.writeRun(ctx, sp, t, rev, rec, a, cmps, ops)
		if err != nil {
			return Run{}, err
		}
		if !ok {
			continue
		}
		if rec.Queued {
			return rec.Run, nil
		}
		// A failure here leaves rec admitted without its task: the next
		// read of it (join, stream, get of the thread's runs) stops what it
		// stopped and submits the task (ensureTask). The client's leaving
		// is no failure: what the admission began goes on past the
		// request, for a while.
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), afterAdmission)
		defer cancel()
		if err := s.finishStops(bctx, rec); err != nil {
			return Run{}, err
		}
		return s.submitRun(bctx, sp, rec, params, delay, before)
	}
	return Run{}, errRaced("the thread")
}

// afterAdmission bounds what a create does once its run is admitted (the
// stops, the task's submit) after its request has ended.
const afterAdmission = time.Minute

// writeRun is the transaction that stores run rec on thread t (read at
// rev) and marks the thread busy, with cmps and ops (the runs it stops);
// it compares the thread's revision and the run's absence. It answers
// the thread as it was and its revision after (0 when the transaction
// did not apply: another change came between).
func (s *server) writeRun(ctx context.Context, sp keyspace.Space, t Thread, rev int64, rec runRecord, a assistantRecord, cmps []clientv3.Cmp, ops []clientv3.Op) (threadBefore, bool, error) {
	before, _ := json.Marshal(t)
	t.Status, t.UpdatedAt = "busy", s.now()
	if t.Metadata["graph_id"] == nil || t.Metadata["assistant_id"] == nil {
		t.Metadata = orEmpty(t.Metadata)
		t.Metadata["graph_id"], t.Metadata["assistant_id"] = a.GraphID, a.AssistantID
	}
	traw, _ := json.Marshal(t)
	rraw, _ := json.Marshal(rec)
	tkey, rkey := sp.AgentThread(t.ThreadID), sp.AgentRun(rec.ThreadID, rec.RunID)
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(tkey), "=", rev), clientv3.Compare(clientv3.CreateRevision(rkey), "=", 0), storeguard.NotFull(sp))
	ops = append(ops, clientv3.OpPut(tkey, string(traw)), clientv3.OpPut(rkey, string(rraw)), clientv3.OpPut(sp.AgentActiveRun(rec.ThreadID, rec.RunID), ""))
	resp, err := s.cfg.Etcd.Txn(ctx).If(cmps...).Then(ops...).Else(storeguard.GetOp(sp), clientv3.OpGet(rkey, clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return threadBefore{}, false, etcdError("creating the run", err)
	}
	if !resp.Succeeded {
		if err := guardOf(resp, 0); err != nil {
			return threadBefore{}, false, err
		}
		if len(resp.Responses[1].GetResponseRange().Kvs) > 0 {
			return threadBefore{}, false, errRunExists{rec.RunID}
		}
		return threadBefore{}, false, nil
	}
	return threadBefore{raw: before, rev: resp.Header.Revision}, true, nil
}

// threadBefore is a thread's record before a run's create changed it,
// and the revision of that change: a create whose task the queue refused
// puts the record back unless the thread changed since.
type threadBefore struct {
	raw []byte
	rev int64
}

// refuseMade is errRunExists when run r is stored already (a cron's fire
// made again): the transaction that stores it compares its absence too.
func (s *server) refuseMade(ctx context.Context, sp keyspace.Space, r runRecord) error {
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentRun(r.ThreadID, r.RunID), clientv3.WithKeysOnly())
	if err != nil {
		return etcdError("reading the run", err)
	}
	if len(resp.Kvs) > 0 {
		return errRunExists{r.RunID}
	}
	return nil
}

// maxTxnOps is etcd's default bound on the operations (and on the
// compares) of one transaction; writeRunOps, what writeRun adds to a
// create's own.
const (
	maxTxnOps   = 128
	writeRunOps = 4
)

// onlyQueued reports whether runs has runs not ended, all of them queued.
func onlyQueued(runs []runRecord) bool {
	n := 0
	for _, o := range runs {
		switch {
		case o.Ended:
		case !o.Queued:
			return false
		default:
			n++
		}
	}
	return n > 0
}

// stopPlan is what new run r's transaction does to thread's runs: the
// runs not ended (active), the compares on their records, and the
// changes: with interrupt the active runs written ended interrupted,
// with rollback the records deleted.
func (s *server) stopPlan(sp keyspace.Space, r runRecord, runs []runRecord, revs []int64) (active []runRecord, cmps []clientv3.Cmp, ops []clientv3.Op) {
	for i, o := range runs {
		if o.Ended {
			continue
		}
		active = append(active, o)
		okey := sp.AgentRun(r.ThreadID, o.RunID)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(okey), "=", revs[i]))
		switch r.MultitaskStrategy {
		case "interrupt":
			o.Status, o.Ended, o.Error, o.UpdatedAt = "interrupted", true, nil, s.now()
			raw, _ := json.Marshal(o)
			ops = append(ops, clientv3.OpPut(okey, string(raw)), clientv3.OpDelete(sp.AgentActiveRun(r.ThreadID, o.RunID)))
		case "rollback":
			ops = append(ops, clientv3.OpDelete(okey), clientv3.OpDelete(sp.AgentActiveRun(r.ThreadID, o.RunID)))
		}
	}
	return active, cmps, ops
}

// submitRun submits admitted run r's task (due after delay), and takes
// the run back when the queue does not take it: its record, and the
// thread as it was before (unless the thread changed since rev).
func (s *server) submitRun(ctx context.Context, sp keyspace.Space, r runRecord, params []byte, delay time.Duration, before threadBefore) (Run, error) {
	tkey := sp.AgentThread(r.ThreadID)
	q, err := s.queueOf(ctx)
	if err != nil {
		return Run{}, err
	}
	defer closeQueue(q)
	// A graph's error ends the task as a success whose outcome says
	// error; only a runtime lost mid-run costs an attempt, and the next
	// resumes the graph from the thread's last checkpoint.
	res, err := q.Submit(ctx, RunsQueue, []queue.Task{{ID: r.RunID, Type: r.GraphID, Parameters: params, Delay: queue.Duration(delay)}}, nil)
	var refused error // the queue refused the task (its input too large): the caller's to fix
	if err == nil && len(res.Rejected) > 0 {
		err = errors.New(res.Rejected[0].Error)
		refused = huma.NewError(http.StatusBadRequest, "body: the run's queue task was refused: "+res.Rejected[0].Error)
	}
	if err != nil {
		bg := context.WithoutCancel(ctx)
		if _, gerr := q.Get(bg, r.RunID); gerr == nil { // submitted after all (the answer was lost)
			return r.Run, nil
		}
		// The record without its task would never run: take it back, and
		// the thread's status with it unless the thread changed since.
		_, _ = s.cfg.Etcd.Txn(bg).If(clientv3.Compare(clientv3.ModRevision(tkey), "=", before.rev)).
			Then(clientv3.OpDelete(sp.AgentRun(r.ThreadID, r.RunID)), clientv3.OpDelete(sp.AgentActiveRun(r.ThreadID, r.RunID)), clientv3.OpPut(tkey, string(before.raw))).
			Else(clientv3.OpDelete(sp.AgentRun(r.ThreadID, r.RunID)), clientv3.OpDelete(sp.AgentActiveRun(r.ThreadID, r.RunID))).Commit()
		if refused != nil {
			return Run{}, refused
		}
		return Run{}, etcdError("submitting the run's task", err)
	}
	return r.Run, nil
}

// refuseWhileActive is a 409 while thread has a run not ended (pending,
// delayed, enqueued or running), as LangGraph refuses a state update then.
func (s *server) refuseWhileActive(ctx context.Context, thread string) error {
	active, err := s.activeRun(ctx, thread)
	if err != nil || active == "" {
		return err
	}
	return errBusyForUpdate(thread, active)
}

// errBusyForUpdate is the 409 of a state update of thread while its run
// active has not ended.
func errBusyForUpdate(thread, active string) error {
	return huma.NewError(http.StatusConflict, fmt.Sprintf("Thread %s is busy with run %s: update its state once the run has ended", thread, active))
}

// activeRun is the id of a run of thread that has not ended, or "".
func (s *server) activeRun(ctx context.Context, thread string) (string, error) {
	runs, _, err := s.threadRuns(ctx, thread, nil)
	if err != nil {
		return "", err
	}
	for _, r := range runs {
		if !r.Ended {
			return r.RunID, nil
		}
	}
	return "", nil
}

// getRun reads run id of thread, its status as its task has it; a run
// its task shows ended is settled (see settle) on the way.
func (s *server) getRun(ctx context.Context, thread, id string) (runRecord, int64, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return runRecord{}, 0, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentRun(thread, id))
	if err != nil {
		return runRecord{}, 0, etcdError("reading the run", err)
	}
	if len(resp.Kvs) == 0 {
		return runRecord{}, 0, errRunNotFound(id)
	}
	var r runRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		return runRecord{}, 0, undecodable("run", id, err)
	}
	revs := []int64{resp.Kvs[0].ModRevision}
	if err := s.withTaskStatus(ctx, []*runRecord{&r}, revs); err != nil {
		return runRecord{}, 0, err
	}
	return r, revs[0], nil
}

func isNotFound(err error) bool {
	var se huma.StatusError
	return errors.As(err, &se) && se.GetStatus() == http.StatusNotFound
}

// runRecords reads thread's run records as stored, newest first, with
// their revisions.
func (s *server) runRecords(ctx context.Context, thread string) ([]runRecord, []int64, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, nil, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentRuns(thread), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		return nil, nil, etcdError("listing runs", err)
	}
	out := make([]runRecord, 0, len(resp.Kvs))
	revs := make([]int64, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r runRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, nil, undecodable("run", idOf(kv.Key), err)
		}
		out, revs = append(out, r), append(revs, kv.ModRevision)
	}
	return out, revs, nil
}

// listRuns returns thread's runs, newest first, their status as their
// tasks have it.
func (s *server) listRuns(ctx context.Context, thread string) ([]runRecord, error) {
	out, revs, err := s.runRecords(ctx, thread)
	if err != nil {
		return nil, err
	}
	ptrs := make([]*runRecord, len(out))
	for i := range out {
		ptrs[i] = &out[i]
	}
	if err := s.withTaskStatus(ctx, ptrs, revs); err != nil {
		return nil, err
	}
	return out, nil
}

// waitRun waits until run id of thread ends, then answers it. It
// watches the run's record, which an outcome and every stop write ended:
// one key, one wake a run. A run whose task ended without an outcome (a
// runtime that died on its last attempt) is settled by a read of its
// task (getRun), made every runTaskCheck while the record is unchanged,
// and at once unless checked: the caller read the task just now (a join,
// whose getRun answered 404 for a run not there), or created the run and
// submitted its task in this request (a wait: the task is there and
// cannot have ended yet; no read of it, and no ensureTask).
func (s *server) waitRun(ctx context.Context, thread, id string, checked bool) (runRecord, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return runRecord{}, err
	}
	var check time.Time // when the task is read next; zero: now
	if checked {
		check = time.Now().Add(runTaskCheck)
	}
	for ctx.Err() == nil {
		r, rev, at, err := s.runAsStored(ctx, sp, thread, id)
		if err != nil || r.Ended {
			return r, err
		}
		next := admitRecheck
		switch {
		case r.Queued: // enqueued behind another run: its turn may have come without anyone admitting it
			if err := s.admitNext(ctx, thread); err != nil {
				return runRecord{}, err
			}
		case !time.Now().Before(check):
			taskChecks.Add(1)
			if err := s.withTaskStatus(ctx, []*runRecord{&r}, []int64{rev}); err != nil {
				return runRecord{}, err
			}
			if r.Ended {
				return r, nil
			}
			check, next = time.Now().Add(runTaskCheck), runTaskCheck
		default:
			next = time.Until(check)
		}
		s.awaitChange(ctx, sp.AgentRun(thread, id), at, next)
	}
	return runRecord{}, ctx.Err()
}

// runTaskCheck is how often a wait reads the task of a run whose record
// has not ended (see waitRun).
var runTaskCheck = 5 * time.Second

// taskChecks counts the waits' reads of a run's task (for tests).
var taskChecks atomic.Int64

// runAsStored reads run id of thread as stored, its status not yet from
// its task, with its revision (what a settle compares) and the store's at
// the read (where a watch of its changes starts: a record written long
// ago may be compacted past its own revision).
func (s *server) runAsStored(ctx context.Context, sp keyspace.Space, thread, id string) (r runRecord, rev, at int64, err error) {
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentRun(thread, id))
	if err != nil {
		return r, 0, 0, etcdError("reading the run", err)
	}
	if len(resp.Kvs) == 0 {
		return r, 0, 0, errRunNotFound(id)
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		return r, 0, 0, undecodable("run", id, err)
	}
	return r, resp.Kvs[0].ModRevision, resp.Header.Revision, nil
}

// awaitChange returns once key changes after revision rev, or after d,
// or with ctx's end. A watch that ends without a change (no leader, an
// error) waits d out: a caller's loop never spins.
func (s *server) awaitChange(ctx context.Context, key string, rev int64, d time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	wr, ok := <-s.cfg.Etcd.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(rev+1))
	if ok && wr.Err() == nil && len(wr.Events) > 0 {
		return
	}
	<-wctx.Done()
}

// threadState reads what the runtime of thread's last run reported.
func (s *server) threadState(ctx context.Context, thread string) (stateRecord, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return stateRecord{}, err
	}
	if _, _, err := s.getThread(ctx, thread); err != nil {
		return stateRecord{}, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentThreadState(thread))
	if err != nil {
		return stateRecord{}, etcdError("reading the thread's state", err)
	}
	if len(resp.Kvs) == 0 {
		return stateRecord{State: emptyState()}, nil
	}
	var st stateRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &st); err != nil {
		return stateRecord{}, undecodable("thread state", thread, err)
	}
	return st, nil
}
