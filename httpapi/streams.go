package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/internal/serverclose"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// StreamEvent is one event of a task's stream.
type StreamEvent struct {
	Seq     int64           `json:"seq" doc:"The event's place in the stream: 1, 2, 3, ... with no gap; its SSE id."`
	Attempt int             `json:"attempt" doc:"The task's attempt that wrote it."`
	Type    string          `json:"type" doc:"The writer's own type (token, progress, log, ...) or drover's: attempt_started, attempt_lost, attempt_ended, done."`
	Data    json.RawMessage `json:"data" doc:"The event's JSON value."`
	Time    time.Time       `json:"time" doc:"When it was emitted."`
}

// StreamInput is an event to append.
type StreamInput struct {
	Type string          `json:"type" minLength:"1" maxLength:"64" doc:"The event's type: token, progress, log, or any of yours; not one of drover's own."`
	Data json.RawMessage `json:"data,omitempty" doc:"The event's value: any JSON value, at most 64 KiB with its type."`
}

// StreamAppended is the answer to an append.
type StreamAppended struct {
	First int64 `json:"first" doc:"The sequence number of the first event appended."`
	Last  int64 `json:"last" doc:"The sequence number of the last."`
}

// StreamEnd is the last SSE event of a stream the server ends.
type StreamEnd struct {
	Reason string `json:"reason" enum:"done,ended,closing,error" doc:"done: the task ended (its done event was sent); ended: the task ended without a done event (cancelled while its claim was lost, or ended by an external worker); closing: the server shuts down (reconnect with Last-Event-ID); error: reading the stream failed (reconnect with Last-Event-ID)."`
	Detail string `json:"detail,omitempty" doc:"What happened."`
}

// StreamPage is the answer to a client that does not accept
// text/event-stream: the events stored, from the one asked for.
type StreamPage struct {
	Events []StreamEvent `json:"events" doc:"The stored events from the one asked for, at most 1,000."`
	Next   int64         `json:"next" doc:"The sequence number to ask for next (?from=)."`
	Done   bool          `json:"done" doc:"The stream ended: its last event is done."`
}

type appendStreamInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"128" doc:"The task's id."`
	Body struct {
		Session string        `json:"session" pattern:"^[0-9a-f]{1,16}\\.[a-z2-7]{16,64}$" doc:"The session the task was claimed under."`
		Token   int64         `json:"token" minimum:"1" doc:"The token the claim returned with the task (a queue's or an agent task's): the events are stored only while it holds."`
		Events  []StreamInput `json:"events" minItems:"1" maxItems:"1000" doc:"The events, in order."`
	}
}

type followStreamInput struct {
	ID          string `path:"id" minLength:"1" maxLength:"128" doc:"The task's id."`
	From        int64  `query:"from" minimum:"0" doc:"Start at this sequence number (0 or 1: the first event)."`
	LastEventID string `header:"Last-Event-ID" doc:"Resume after this event (its seq), as EventSource does on reconnecting; wins over from when later."`
	Accept      string `header:"Accept" doc:"text/event-stream for the stream; anything else gets the events stored, as JSON."`
}

const streamDescription = "A task's stream as Server-Sent Events: every event stored from ?from= (or after Last-Event-ID), then " +
	"each as it is written, in order, each once, with its seq as SSE id; a consumer may start before the task starts, while it " +
	"runs or after it ended (within the stream's retention, 24 h by default) and sees the same sequence. After a takeover the " +
	"next attempt's events follow an attempt_lost event: nothing of the lost attempt comes after it. The stream ends after its " +
	"done event (an `end` event follows). A comment line every 15 s keeps idle streams open. Without text/event-stream in " +
	"Accept the answer is the events stored, as JSON. The same route follows a queue's task and an agent task. 404 when the " +
	"task is unknown (no queue task, no agent task's checkpoint or claim) and has no stream; 400 on a malformed " +
	"Last-Event-ID. A thousand followers of one stream on one server cost etcd one watch."

func (s *Server) streamRoutes() {
	tags := []string{"streams"}
	huma.Register(s.api, huma.Operation{
		OperationID: "append-task-stream", Method: http.MethodPost, Path: "/v1/tasks/{id}/stream/events", Tags: tags,
		Summary: "Append events to a claimed task's stream, fenced by the claim's token",
		Description: "For external workers: the events are stored, in order, after every event before, only while the claim " +
			"(session and token, from POST /v1/queues/{queue}/claim, or, for an agent task, POST /v1/agent-tasks/{id}/claim) holds. " +
			"409 once it does not (it expired, the task was taken over) and nothing is stored; 413 when they would take the stream " +
			"past its caps (100,000 events, 16 MiB, 64 KiB an event); 507 while etcd's database is past the store-full guard's " +
			"high-water mark (nothing is stored); 404 for an unknown task. The answer returns once they are " +
			"stored. An agent task's step write that completes it ends its stream with done; one that parks it (a sleep, a wait, " +
			"children), or a release, ends the claim's events with attempt_ended.",
		MaxBodyBytes:    2 << 20,
		BodyReadTimeout: bulkAllowance, // a body over DefaultMaxBodyBytes may take as long as a submission's
		Errors:          []int{http.StatusNotFound, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, s.appendStream)
	huma.Register(s.api, huma.Operation{
		OperationID: "follow-task-stream", Method: http.MethodGet, Path: "/v1/tasks/{id}/stream", Tags: tags,
		Summary:     "Follow a task's stream: tokens, progress and attempt boundaries (Server-Sent Events)",
		Description: streamDescription,
		Errors:      []int{http.StatusBadRequest, http.StatusNotFound},
		Responses: map[string]*huma.Response{"200": {
			Description: "An event stream: message events (StreamEvent, id: seq), then end (StreamEnd); or, without " +
				"text/event-stream in Accept, StreamPage as JSON.",
			Content: map[string]*huma.MediaType{
				"text/event-stream": {Schema: &huma.Schema{Type: huma.TypeString, Description: "id: seq, data: one StreamEvent; event: end, data: StreamEnd"}},
				"application/json":  {Schema: s.api.OpenAPI().Components.Schemas.Schema(reflect.TypeFor[StreamPage](), true, "StreamPage")},
			},
		}},
	}, s.followStream)
	for _, t := range []reflect.Type{reflect.TypeFor[StreamEvent](), reflect.TypeFor[StreamEnd]()} {
		s.api.OpenAPI().Components.Schemas.Schema(t, true, "")
	}
}

// streamProblem is problem, with a full stream a 413.
func streamProblem(err error) error {
	if errors.Is(err, stream.ErrStreamFull) {
		return newProblem(http.StatusRequestEntityTooLarge, "stream-full", err.Error())
	}
	return problem(err, map[string]string{"task id": "path.id", "token": "body.token"})
}

func (s *Server) appendStream(ctx context.Context, in *appendStreamInput) (*struct{ Body StreamAppended }, error) {
	if err := keyspace.CheckName("task id", in.ID); err != nil {
		return nil, streamProblem(err)
	}
	ins := make([]stream.Input, len(in.Body.Events))
	for i, e := range in.Body.Events {
		ins[i] = stream.Input{Type: e.Type, Data: e.Data}
	}
	w := stream.For(s.cli, s.keys(ctx))
	key := stream.ClaimKey{NS: s.nsOf(ctx), Task: in.ID, Token: in.Body.Token}
	if claim, ok := s.streamClaims.Held(key, in.Body.Session); ok {
		first, last, err := w.Append(ctx, claim, ins)
		if !errors.Is(err, stream.ErrFenced) {
			return appended(first, last, err)
		}
		// Lost since, or another attempt wrote: the claim is read again, and refused as it should be.
		s.streamClaims.Forget(key)
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	var claim stream.Claim
	switch t, err := c.Get(ctx, in.ID); {
	case errors.Is(err, queue.ErrNotFound):
		// Not a queue task: an agent task, claimed at /v1/agent-tasks.
		if claim, err = s.agentStreamClaim(ctx, in.ID, in.Body.Session, in.Body.Token); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, streamProblem(err)
	default:
		h, err := s.held(ctx, t.Queue, in.ID, in.Body.Session, in.Body.Token)
		if err != nil {
			return nil, err
		}
		if claim, err = c.StreamClaim(ctx, h); err != nil {
			perr := streamProblem(err)
			if p := (*Problem)(nil); errors.As(perr, &p) && p.Status == http.StatusConflict {
				// Not the queue task's claim: an agent task of the same id
				// may be claimed with it.
				if ac, aerr := s.agentStreamClaim(ctx, in.ID, in.Body.Session, in.Body.Token); aerr == nil {
					claim = ac
					break
				}
			}
			return nil, perr
		}
		s.streamClaims.Put(key, in.Body.Session, claim)
	}
	return appended(w.Append(ctx, claim, ins))
}

// appended is the answer of an append that stored events first to last,
// or its error as a problem.
func appended(first, last int64, err error) (*struct{ Body StreamAppended }, error) {
	if err != nil {
		perr := streamProblem(err)
		var p *Problem
		if errors.As(perr, &p) && len(p.Errors) > 0 && strings.HasPrefix(p.Errors[0].Location, "events[") {
			p.Errors[0].Location = "body." + p.Errors[0].Location
		}
		return nil, perr
	}
	return &struct{ Body StreamAppended }{StreamAppended{First: first, Last: last}}, nil
}

// A queue task's stream is appended to under its claim, whose fence (the
// claim key's create revision is the token, the task's slot has not left
// its segment) every append's transaction compares: so the claim a first
// append read (the task, to learn its queue, the session, the claim), or
// the start of an Agent Server run (which checked it under the session
// it took the thread's lock with), is kept, by namespace, task and token
// with its session (streamClaims, a stream.ClaimCache shared with the
// Agent Server's routes), and the attempt's later appends skip those
// reads. A claim lost since (the session ended, the task was cancelled
// or claimed again) fails the append's compares (stream.ErrFenced): it
// is forgotten and read again, which refuses the append as before.

// streamFrom is where a follower starts: after Last-Event-ID, or at
// from, whichever is later.
func streamFrom(in *followStreamInput) (int64, error) {
	next := max(in.From, 1)
	if in.LastEventID != "" {
		seq, err := strconv.ParseInt(strings.TrimSpace(in.LastEventID), 10, 64)
		if err != nil || seq < 0 || seq == math.MaxInt64 {
			return 0, invalid("header.Last-Event-ID", in.LastEventID, "must be the id of an event of this stream: its seq, a whole number")
		}
		next = max(next, seq+1)
	}
	return next, nil
}

// streamKnown answers 404 unless task id is a queue task or has a
// stream.
func (s *Server) streamKnown(ctx context.Context, id string) error {
	if err := keyspace.CheckName("task id", id); err != nil {
		return streamProblem(err)
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return err
	}
	switch _, err = c.Get(ctx, id); {
	case err == nil:
		return nil
	case !errors.Is(err, queue.ErrNotFound):
		return streamProblem(err)
	}
	known, err := s.agentTaskKnown(ctx, id)
	if err != nil {
		return problem(err, nil)
	}
	if !known {
		return newProblem(http.StatusNotFound, "not-found", fmt.Sprintf("task %s: no such task, and no stream (it may have passed its retention)", id))
	}
	return nil
}

// agentTaskKnown says whether agent task id has a checkpoint, a claim
// or a stream.
func (s *Server) agentTaskKnown(ctx context.Context, id string) (bool, error) {
	keys := s.keys(ctx)
	r, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(keys.StreamChunks(id), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(keys.TaskCheckpoint(id), clientv3.WithCountOnly()),
		clientv3.OpGet(keys.Lock(keyspace.TaskLock(id)), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("read task %s: %w", id, err)
	}
	for _, op := range r.Responses {
		if op.GetResponseRange().Count > 0 {
			return true, nil
		}
	}
	return false, nil
}

// agentStreamClaim is the claim of agent task id held with token under
// session (POST /v1/agent-tasks/{id}/claim) as the writer of its stream:
// 409 when the claim is not held so, 404 when the task has no
// checkpoint, no claim and no stream. An agent task's attempt is the
// count of its claims that wrote its stream.
func (s *Server) agentStreamClaim(ctx context.Context, id, session string, token int64) (stream.Claim, error) {
	if err := task.CheckID(id); err != nil {
		return stream.Claim{}, problem(err, taskWhere)
	}
	f, err := s.claimFence(ctx, id, session, token)
	if p := (*Problem)(nil); errors.As(err, &p) && p.Status == http.StatusConflict {
		if known, kerr := s.agentTaskKnown(ctx, id); kerr == nil && !known {
			return stream.Claim{}, newProblem(http.StatusNotFound, "not-found", fmt.Sprintf("task %s: no such task (neither a queue's task nor an agent task)", id))
		}
	}
	if err != nil {
		return stream.Claim{}, err
	}
	n, _, _, err := stream.For(s.cli, s.keys(ctx)).NextAttempt(ctx, id, token)
	if err != nil {
		return stream.Claim{}, problem(err, nil)
	}
	return stream.Claim{Task: id, Attempt: n, Worker: f.holder.ID, Fence: f}, nil
}

// Compares hold while the lock is held with its token: a heldLock (an
// agent task's claim) fences the writes of the task's stream.
func (h *heldLock) Compares() []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.token)}
}

var _ stream.Fence = (*heldLock)(nil)

// endAgentAttempt closes the events of the agent task's claim f with
// attempt_ended and outcome, while the claim still holds (a step write
// that parks the task, a release), if the claim wrote the stream's last
// events; otherwise nothing is written.
func (s *Server) endAgentAttempt(ctx context.Context, id string, f *heldLock, outcome string) {
	w := stream.For(s.cli, s.keys(ctx))
	n, _, own, err := w.NextAttempt(ctx, id, f.token)
	if err == nil && own {
		err = w.End(ctx, stream.Claim{Task: id, Attempt: n, Worker: f.holder.ID, Fence: f}, stream.AttemptEnded, outcome, nil)
	}
	if err != nil {
		s.cfg.Logger.Debug("httpapi: the end of an agent task's attempt was not written to its stream", "task", id, "err", err)
	}
}

// finishAgentStream closes the stream of agent task id, which its
// stored checkpoint completed, with done (fenced by the stream alone;
// nothing for a stream without events).
func (s *Server) finishAgentStream(ctx context.Context, id string) {
	if err := stream.For(s.cli, s.keys(ctx)).Finish(ctx, id, "succeeded", ""); err != nil {
		s.cfg.Logger.Debug("httpapi: the done of an agent task was not written to its stream", "task", id, "err", err)
	}
}

// agentTaskEnded says whether agent task id is completed, or gone
// (no checkpoint, no claim, no stream), which, and when it completed
// (its last checkpoint's time; zero when gone).
func (s *Server) agentTaskEnded(ctx context.Context, id string) (string, time.Time, bool) {
	store, err := s.taskStore(ctx)
	if err != nil {
		return "", time.Time{}, false
	}
	if cp, err := store.Load(ctx, id); err != nil || cp.Completed {
		return "completed", cp.At, err == nil
	}
	if known, err := s.agentTaskKnown(ctx, id); err == nil && !known {
		return "removed", time.Time{}, true
	}
	return "", time.Time{}, false
}

func (s *Server) followStream(ctx context.Context, in *followStreamInput) (*huma.StreamResponse, error) {
	next, err := streamFrom(in)
	if err != nil {
		return nil, err
	}
	if err := s.streamKnown(ctx, in.ID); err != nil {
		return nil, err
	}
	hub := stream.HubFor(s.cli, s.keys(ctx))
	if !strings.Contains(in.Accept, "text/event-stream") {
		page, err := readStreamPage(ctx, hub, in.ID, next)
		if err != nil {
			return nil, problem(err, nil)
		}
		return &huma.StreamResponse{Body: func(hctx huma.Context) {
			_, w, ok := startStream(hctx)
			if !ok {
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_ = json.NewEncoder(w).Encode(page)
		}}, nil
	}
	return &huma.StreamResponse{Body: func(hctx huma.Context) {
		ctx, w, ok := startStream(hctx)
		if !ok {
			return
		}
		st := &eventStream{w: w, rc: http.NewResponseController(w)}
		s.sendStream(ctx, st, hub, in.ID, next)
	}}, nil
}

// readStreamPage reads up to 1,000 stored events from next on.
func readStreamPage(ctx context.Context, hub *stream.Hub, id string, next int64) (StreamPage, error) {
	page := StreamPage{Events: []StreamEvent{}, Next: next}
	err := hub.Read(ctx, id, next, func(list []stream.Event) bool {
		for _, ev := range list {
			if ev.Seq < page.Next {
				continue
			}
			page.Events = append(page.Events, StreamEvent(ev))
			page.Next, page.Done = ev.Seq+1, ev.Type == stream.Done
		}
		return len(page.Events) < 1000
	})
	return page, err
}

// A follower whose task ended with events stored and no done asks
// whether it ended every streamEndedCheck, and ends so once it was found
// so at two checks streamEndSettle apart, or streamEndSettle after the
// task's end (the done is written after the outcome is stored: a
// follower may look in between). 0: every streamKeepalive,
// stream.EndedSettle apart.
var streamEndedCheck, streamEndSettle atomic.Int64

// streamEnds is the option of a follower of task id that ends it with
// the task (its status, once ended, in *ended).
func (s *Server) streamEnds(id string, ended *string) []stream.FollowOption {
	every, settle := time.Duration(streamEndedCheck.Load()), time.Duration(streamEndSettle.Load())
	if every == 0 {
		every = streamKeepalive
	}
	if settle == 0 {
		settle = stream.EndedSettle
	}
	return []stream.FollowOption{stream.WhenEndedAt(func(ctx context.Context) (time.Time, bool) {
		status, at, ok := s.taskEnded(ctx, id)
		if ok {
			*ended = status
		}
		return at, ok
	}, every), stream.SettleAfter(settle)}
}

// followed is one step of a follower: an event or its error.
type followed struct {
	ev  stream.Event
	err error
}

// sendStream writes task id's events from next on until the stream's
// last done event, the task's end with nothing more stored (a task
// that ended without a done), the client going away, or the server
// closing.
func (s *Server) sendStream(ctx context.Context, st *eventStream, hub *stream.Hub, id string, next int64) {
	st.w.Header().Set("Content-Type", "text/event-stream")
	st.w.Header().Set("Cache-Control", "no-cache")
	st.w.Header().Set("X-Accel-Buffering", "no")
	st.w.WriteHeader(http.StatusOK)
	_ = st.rc.Flush() // the client knows the stream is open before its first event
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	evs := make(chan followed, 64)
	var ended string // the task's status, once the follower ended with it
	endsWithTask := s.streamEnds(id, &ended)
	go func() {
		defer close(evs)
		for ev, err := range hub.Follow(fctx, id, next, endsWithTask...) {
			select {
			case evs <- followed{ev, err}:
			case <-fctx.Done():
				return
			}
		}
	}()
	closing := serverclose.Of(ctx)
	tick := time.NewTicker(streamKeepalive)
	defer tick.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-closing:
			_ = st.send("end", 0, StreamEnd{Reason: "closing", Detail: "the server shuts down: reconnect with Last-Event-ID"})
			return
		case <-tick.C:
			if st.comment("keepalive") != nil {
				return
			}
		case f, ok := <-evs:
			switch {
			case !ok && ctx.Err() != nil:
				return
			case !ok && last == stream.Done:
				_ = st.send("end", 0, StreamEnd{Reason: "done", Detail: "the task ended"})
				return
			case !ok:
				// The follower ends only so, with its task's end, every
				// event stored given.
				_ = st.send("end", 0, StreamEnd{Reason: "ended", Detail: "the task is " + ended + " and its stream has no done event"})
				return
			case f.err != nil:
				s.cfg.Logger.Warn("httpapi: a task's stream could not be read", "task", id, "err", f.err)
				_ = st.send("end", 0, StreamEnd{Reason: "error", Detail: "the stream could not be read: reconnect with Last-Event-ID"})
				return
			}
			if st.send("message", f.ev.Seq, StreamEvent(f.ev)) != nil {
				return
			}
			last = f.ev.Type
		}
	}
}

// taskEnded says whether queue task id is SUCCEEDED, DEAD or CANCELLED
// (or gone), which, and when it ended (the time of its last transition,
// to that status; zero when not known; stream.NoDoneFollows when its
// end's transaction settled its stream).
func (s *Server) taskEnded(ctx context.Context, id string) (string, time.Time, bool) {
	c, err := s.queueClient(ctx)
	if err != nil {
		return "", time.Time{}, false
	}
	t, err := c.Get(ctx, id)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		return s.agentTaskEnded(ctx, id)
	case err != nil || !t.CurrentStatus.Terminal():
		return "", time.Time{}, false
	}
	if t.StreamSettled { // its done, if any, was stored with its end
		return string(t.CurrentStatus), stream.NoDoneFollows, true
	}
	return string(t.CurrentStatus), t.EndedAt(), true
}

// endStream closes the stream of an external worker's attempt that its
// ack or fail just ended (t is the task after it): done when the task
// ended, whichever server wrote its events (fenced by the stream
// alone, after the stored outcome); attempt_ended when it will be
// retried, sleeps, waits for a signal or was deferred, if the attempt
// wrote the stream's last events (through any server).
func (s *Server) endStream(ctx context.Context, h queue.Held, t *queue.Task, cause string) {
	var err error
	switch t.CurrentStatus {
	case queue.Succeeded, queue.Dead:
		err = stream.For(s.cli, s.keys(ctx)).Finish(ctx, h.ID, strings.ToLower(string(t.CurrentStatus)), cause)
	case queue.Retrying, queue.Sleeping, queue.Waiting: // a wait answered at once is RUNNING: the attempt goes on
		err = stream.For(s.cli, s.keys(ctx)).Ended(ctx, h.ID, h.Token, stream.AttemptEnded, strings.ToLower(string(t.CurrentStatus)), cause)
	case queue.Pending: // deferred: claimed again later
		err = stream.For(s.cli, s.keys(ctx)).Ended(ctx, h.ID, h.Token, stream.AttemptEnded, "deferred", cause)
	}
	if err != nil {
		s.cfg.Logger.Debug("httpapi: the end of an attempt was not written to its stream", "task", h.ID, "err", err)
	}
}

// endAgentStream closes the stream of agent task id after the step
// write that stored checkpoint next, which ends the claim: done when it
// completed the task, attempt_ended when it parks it.
func (s *Server) endAgentStream(ctx context.Context, id string, f *heldLock, next task.Checkpoint) {
	switch {
	case next.Completed:
		s.finishAgentStream(ctx, id)
	case !next.SleepUntil.IsZero():
		s.endAgentAttempt(ctx, id, f, "sleeping")
	default:
		s.endAgentAttempt(ctx, id, f, "waiting")
	}
}
