package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A run's start, in one request: the runtime that claimed the run's task
// takes the thread's lock (which fences the run's checkpoint writes),
// learns whether the run was stopped before it started, and reads the
// thread's head, instead of a lock request, a read of its task and a read
// of the head.
//
// The lock first, then the claim: a stop (cancel, interrupt, rollback:
// stopRuns) cancels the run's task, which takes its claim, before it
// deletes the thread's lock (takeThread). A stop whose delete came before
// the lock was taken cancelled the task before too, and the claim's read
// after the lock sees it: the start refuses, and lets the lock go. A stop
// whose delete comes after took the lock from the run: its checkpoint
// writes, fenced by the lock, are refused from then on.

// RunLock is the thread's lock a run start took: the answer of POST
// /v1/locks/{name} (a client builds its lock from it, to fence its writes
// and to release it).
type RunLock struct {
	Status    string      `json:"status" enum:"acquired" doc:"Always acquired."`
	Name      string      `json:"name" doc:"The lock's name: thread:{thread_id}."`
	Token     int64       `json:"token" doc:"The fencing token: pass it to every checkpoint write of the run, and to release it."`
	Holder    lock.Holder `json:"holder"`
	Session   string      `json:"session,omitempty" doc:"The session the lock is bound to."`
	Contender string      `json:"contender" doc:"The holding's key within the lock, a secret of the holder: pass it, with the token, to release."`
	ExpiresAt time.Time   `json:"expires_at" doc:"When the lock frees itself unless the session is kept alive."`
	// Lease is the session's lease, which the lock was taken under (not
	// answered).
	Lease clientv3.LeaseID `json:"-"`
}

// HeadCheckpoint is a thread's head checkpoint with its pending writes,
// as GET /v1/threads/{thread_id}/head answers it.
type HeadCheckpoint struct {
	ThreadID  string                     `json:"thread_id" doc:"The thread."`
	NS        string                     `json:"checkpoint_ns" doc:"LangGraph's checkpoint_ns; \"\" is the default namespace."`
	ID        string                     `json:"checkpoint_id" doc:"The checkpoint's id; ids are time-ordered."`
	ParentID  string                     `json:"parent_checkpoint_id,omitempty" doc:"The checkpoint it was written on; absent for a thread's first."`
	Metadata  map[string]json.RawMessage `json:"metadata" doc:"Its metadata."`
	State     []byte                     `json:"state" doc:"The state (the serialized checkpoint), base64."`
	Token     int64                      `json:"token,omitempty" doc:"The lock token it was written under, when fenced."`
	CreatedAt time.Time                  `json:"created_at" doc:"When it was written."`
	Writes    []HeadWrite                `json:"pending_writes" doc:"The pending writes saved for it, by task then index."`
}

// HeadWrite is a pending write of a head checkpoint.
type HeadWrite struct {
	TaskID  string `json:"task_id" doc:"The task that made the write."`
	Channel string `json:"channel" doc:"The channel it writes to."`
	Value   []byte `json:"value" doc:"The value, base64."`
	Idx     int    `json:"idx" doc:"Its index among the task's writes (negative for LangGraph's special channels)."`
}

// RunStart answers a run's start: the thread's lock and its head, or
// cancelled.
type RunStart struct {
	Cancelled bool            `json:"cancelled,omitempty" doc:"The run was stopped (its task cancelled) before it started: run nothing. No lock is held then."`
	Lock      *RunLock        `json:"lock,omitempty" doc:"The thread's lock, held under the session: fence the run's checkpoint writes with it, and give it to the outcome, which releases it."`
	Head      *HeadCheckpoint `json:"head" doc:"The thread's head checkpoint in the root namespace (checkpoint_ns \"\"), as GET /v1/threads/{thread_id}/head answers it; null when the thread has none."`
	Events    *EventsAppended `json:"events,omitempty" doc:"Where the start's events went in the run task's stream; absent when it had none."`
}

// runStartBody is what a runtime sends to start a run.
type runStartBody struct {
	Token   int64      `json:"token" minimum:"1" doc:"The fencing token of the runtime's claim of the run's task."`
	Session string     `json:"session" minLength:"1" doc:"The session the task is claimed under: the thread's lock is taken under it."`
	Wait    float64    `json:"wait,omitempty" minimum:"0" doc:"Seconds to wait in line for the thread's lock (as POST /v1/locks/{name}?wait=, capped the same); 0: one attempt."`
	Events  []RunEvent `json:"events,omitempty" maxItems:"1000" doc:"The run's first events (its metadata), appended to the run task's stream under the claim once the lock is taken and the claim checked, before the answer, as POST /v1/tasks/{id}/stream/events appends them: a run's start and its first write in one request. A start whose append fails fails as a whole, its lock let go."`
}

func (s *server) runStartRoute(api huma.API, tags []string) {
	if s.cfg.LockThread == nil {
		return
	}
	huma.Register(api, huma.Operation{
		OperationID: "agent-server-start-run", Method: http.MethodPost, Path: "/v1/agent-server/threads/{thread_id}/runs/{run_id}/start", Tags: tags,
		Summary: "Start a claimed run (for runtimes): the thread's lock and its head",
		Description: "Takes the thread's lock (thread:{thread_id}) under the session, as POST /v1/locks/{name} does, waiting in line up to wait; " +
			"then checks that the runtime still holds the run's task under token (409 otherwise, and the lock is let go); a run whose task " +
			"was cancelled (stopped before it started) answers cancelled, without a lock. Else it answers the lock and the thread's head " +
			"checkpoint (null when none). With events, it appends them to the run task's stream under the claim before it answers " +
			"(events: their first and last seq); should that fail, the start fails and the lock is let go. One request for the lock, " +
			"the task's read, the head's and the run's first events.",
		Errors: []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		RunID    string `path:"run_id" doc:"The run's id, a UUID."`
		Body     runStartBody
	}) (*struct{ Body RunStart }, error) {
		th, id, err := runPath{in.ThreadID, in.RunID}.ids()
		if err != nil {
			return nil, err
		}
		st, err := s.beginRun(ctx, th, id, in.Body)
		return &struct{ Body RunStart }{Body: st}, err
	})
}

// beforeRunLock, when set (by tests), is called before a start takes the
// thread's lock; afterRunClaim, after it read the run's claim.
var beforeRunLock, afterRunClaim func()

// maxRunStartWait bounds a start's wait in seconds before it becomes a
// duration: a day, longer than any server's longest wait.
const maxRunStartWait = 86400.0

// beginRun takes thread's lock for run id, then checks the run's claim
// (see the top of this file), then reads the thread's head.
func (s *server) beginRun(ctx context.Context, thread, id string, in runStartBody) (RunStart, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return RunStart{}, err
	}
	ins, err := runEventInputs(in.Events)
	if err != nil {
		return RunStart{}, err
	}
	// Capped before the conversion (a huge wait would overflow to a negative one); the lock's
	// own cap, the server's longest wait, applies after.
	wait := time.Duration(min(in.Wait, maxRunStartWait) * float64(time.Second))
	if beforeRunLock != nil {
		beforeRunLock()
	}
	l, err := s.cfg.LockThread(ctx, in.Session, keyspace.ThreadLock(thread), wait)
	if err != nil {
		// A stop while the start waited in line deleted its place with
		// the holder's (the lock's error: lost): a stopped run answers
		// cancelled, whatever kept it from the lock.
		if _, cancelled, _, cerr := s.claimHeld(ctx, id, in.Token, 0); cerr == nil && cancelled {
			return RunStart{Cancelled: true}, nil
		}
		return RunStart{}, err
	}
	held := false
	defer func() {
		if !held { // refused or failed: the lock goes, as a runtime would let it go
			s.releaseRunLock(sp, l)
		}
	}()
	// The lock was taken under the session, which proves it (its
	// secret): the claim is read bound to the session's lease too, and
	// kept under the session for the run's appends and its outcome.
	claim, cancelled, bound, err := s.claimHeld(ctx, id, in.Token, l.Lease)
	if err != nil || cancelled {
		return RunStart{Cancelled: cancelled}, err
	}
	if afterRunClaim != nil {
		afterRunClaim()
	}
	var appended *EventsAppended
	if len(ins) > 0 {
		if appended, err = s.appendRunEvents(ctx, sp, claim, ins, "the start's"); err != nil {
			// A stop between the claim's read and the append fenced it:
			// the run was cancelled before it started, as above.
			if se := huma.StatusError(nil); errors.As(err, &se) && se.GetStatus() == http.StatusConflict {
				if _, cancelled, _, cerr := s.claimHeld(ctx, id, in.Token, 0); cerr == nil && cancelled {
					return RunStart{Cancelled: true}, nil
				}
			}
			return RunStart{}, err
		}
	}
	head, err := s.rootHead(ctx, thread)
	if err != nil {
		return RunStart{}, err
	}
	held = true
	if bound {
		s.cfg.Claims.Put(stream.ClaimKey{NS: s.cfg.Namespace(ctx), Task: id, Token: in.Token}, in.Session, claim)
	}
	return RunStart{Lock: &l, Head: head, Events: appended}, nil
}

// claimHeld reports whether the runtime holds run id's task under token:
// its claim, as the writer of the task's stream, when it does; cancelled
// when the task was cancelled; else a 409. With lid (not 0) the claim is
// read bound to that lease first, bound when it is; a claim under another
// lease is then read as without one, and answered as before.
func (s *server) claimHeld(ctx context.Context, id string, token int64, lid clientv3.LeaseID) (claim stream.Claim, cancelled, bound bool, err error) {
	q, err := s.queueOf(ctx)
	if err != nil {
		return claim, false, false, err
	}
	defer closeQueue(q)
	h := queue.Held{Queue: RunsQueue, ID: id, Token: token, Lease: lid}
	claim, err = q.StreamClaim(ctx, h)
	if bound = err == nil && lid != 0; lid != 0 && errors.Is(err, lease.ErrFenced) {
		h.Lease = 0
		claim, err = q.StreamClaim(ctx, h)
	}
	switch {
	case err == nil:
		return claim, false, bound, nil
	case errors.Is(err, lease.ErrFenced):
		if t, gerr := q.Get(ctx, id); gerr == nil && t.CurrentStatus == queue.Cancelled {
			return claim, true, false, nil
		}
		return claim, false, false, huma.NewError(http.StatusConflict, "this runtime no longer holds the run under token "+fmt.Sprint(token)+": "+err.Error())
	case errors.Is(err, queue.ErrNotFound):
		return claim, false, false, huma.NewError(http.StatusConflict, "the run's task is gone (the run or its thread was deleted): "+err.Error())
	}
	return claim, false, false, etcdError("reading the run's claim", err)
}

// rootHead is thread's head checkpoint in the root namespace with its
// pending writes, nil when it has none.
func (s *server) rootHead(ctx context.Context, thread string) (*HeadCheckpoint, error) {
	store, err := checkpoint.NewEtcd(s.cfg.Etcd, s.cfg.Namespace(ctx))
	if err != nil {
		return nil, huma.NewError(http.StatusInternalServerError, "agentserver: "+err.Error())
	}
	cp, err := store.GetLatest(ctx, thread, "")
	if errors.Is(err, checkpoint.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, etcdError("reading the thread's head", err)
	}
	ws, err := store.Writes(ctx, thread, "", cp.ID)
	if err != nil {
		return nil, etcdError("reading the head's pending writes", err)
	}
	out := &HeadCheckpoint{ThreadID: cp.ThreadID, NS: cp.NS, ID: cp.ID, ParentID: cp.ParentID, Metadata: cp.Metadata.Fields(),
		State: cp.State, Token: cp.Token, CreatedAt: cp.CreatedAt, Writes: make([]HeadWrite, len(ws))}
	for i, w := range ws {
		out.Writes[i] = HeadWrite{TaskID: w.TaskID, Channel: w.Channel, Value: append([]byte{}, w.Value...), Idx: w.Idx} // "" for empty, not null
	}
	return out, nil
}

// runLockRelease is the operation that releases thread's lock held as l
// (name, token and contender), none without l: a transaction nested in
// another's that deletes the holding's key if it is still the one created
// at l's token (a lock lost meanwhile, or held by another since, is left
// as it is). A 400 names the field of l that is wrong (its contender not echoed).
func runLockRelease(sp keyspace.Space, thread string, l *outcomeLock) (release []clientv3.Op, err error) {
	if l == nil {
		return nil, nil
	}
	switch {
	case l.Name != keyspace.ThreadLock(thread):
		return nil, badInput("body.lock.name", l.Name, "must be the thread's lock, "+keyspace.ThreadLock(thread)+", as the run's start answered it")
	case l.Token <= 0:
		return nil, badInput("body.lock.token", l.Token, "must be the lock's token as the run's start answered it (above 0)")
	case keyspace.CheckName("contender", l.Contender) != nil:
		// The contender is the holder's secret: not echoed.
		return nil, badInput("body.lock.contender", nil, "must be the contender the run's start answered")
	}
	key := sp.LockContender(l.Name, l.Contender)
	return []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", l.Token)}, []clientv3.Op{clientv3.OpDelete(key)}, nil)}, nil
}

// releaseRunLock lets lock l go (a start that refused or failed), within
// a bound of its own: the request may have ended.
func (s *server) releaseRunLock(sp keyspace.Space, l RunLock) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if rel, err := runLockRelease(sp, threadOfLock(l.Name), &outcomeLock{Name: l.Name, Token: l.Token, Contender: l.Contender}); err == nil {
		s.releaseAlone(ctx, rel)
	}
}

// threadOfLock is the thread of a thread's lock name.
func threadOfLock(name string) string {
	return name[len(keyspace.ThreadLock("")):]
}

// outcomeLock is the thread's lock a run's start took, as its outcome
// names it to release it.
type outcomeLock struct {
	Name      string `json:"name" minLength:"1" maxLength:"256" doc:"The lock's name: thread:{thread_id}."`
	Token     int64  `json:"token" minimum:"1" doc:"Its fencing token."`
	Contender string `json:"contender" minLength:"1" maxLength:"256" doc:"The holding's contender, as the start answered it."`
}
