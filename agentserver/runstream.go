package agentserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/serverclose"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
)

// unbounded is a context with the values of a request's API context (its
// namespace, its token) and the cancellation of the request itself: it
// ends when the client goes away, not at the API's request timeout, so
// that a join, a wait or a stream lasts as long as its run.
type unbounded struct {
	context.Context
	vals context.Context
}

func (u unbounded) Value(k any) any { return u.vals.Value(k) }

func longContext(hctx huma.Context) (context.Context, http.ResponseWriter, *http.Request) {
	r, w := humago.Unwrap(hctx)
	return unbounded{Context: r.Context(), vals: hctx.Context()}, w, r
}

// longAnswer answers f's value as JSON (or its error as a problem) once
// f returns, f running under the request's own context.
func longAnswer(f func(ctx context.Context) (any, error)) *huma.StreamResponse {
	return &huma.StreamResponse{Body: func(hctx huma.Context) {
		ctx, w, req := longContext(hctx)
		v, err := f(ctx)
		if err != nil {
			writeError(w, req, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(v)
	}}
}

// droverEvents are the stream's own events, not the run's: the SSE of a
// run leaves them out.
var droverEvents = map[string]bool{stream.AttemptStarted: true, stream.AttemptLost: true, stream.AttemptEnded: true, stream.Done: true}

// streamRun answers run id's events as LangGraph's SSE, after the first
// skip of them: each event the runtime emitted is one SSE event (its type
// the event name, its data the data), until the run's task ends. Its id is
// its place among the runtime's events, from 0, as LangGraph numbers
// them: drover's own events (an attempt's start, loss and end) take
// sequence numbers of the stream too, but are not sent, so the ids are
// counted here, and a resume reads the stream from its start and skips
// the events the client had.
func (s *server) streamRun(thread, id string, skip int64) *huma.StreamResponse {
	return s.sseAnswer("/threads/"+thread+"/runs/"+id, nil, func(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, q *queue.Client, sp keyspace.Space) {
		if err := s.awaitAdmitted(ctx, thread, id); err != nil { // an enqueued run's task comes once it starts
			_ = writeEvent(w, followed{err: err}, 0)
			return
		}
		s.followRun(ctx, w, rc, q, sp, id, skip, func(f followed, n int64) bool { return writeEvent(w, f, n) })
	})
}

// sseAnswer is an answer of server-sent events, as streamRun and
// streamThread open theirs: the namespace's keyspace and a queue client
// (closed when the answer ends), then before when set (its error answered
// as a problem, no event sent yet), then the stream's headers (with
// Content-Location when location is set), flushed, then events.
func (s *server) sseAnswer(location string, before func(ctx context.Context, sp keyspace.Space) error, events func(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, q *queue.Client, sp keyspace.Space)) *huma.StreamResponse {
	return &huma.StreamResponse{Body: func(hctx huma.Context) {
		ctx, w, req := longContext(hctx)
		sp, err := s.space(ctx)
		if err != nil {
			writeError(w, req, err)
			return
		}
		q, err := s.queueOf(ctx)
		if err != nil {
			writeError(w, req, err)
			return
		}
		defer closeQueue(q)
		if before != nil {
			if err := before(ctx, sp); err != nil {
				writeError(w, req, err)
				return
			}
		}
		rc := http.NewResponseController(w)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		if location != "" {
			w.Header().Set("Content-Location", location)
		}
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		events(ctx, w, rc, q, sp)
	}}
}

// followRun sends run id's events to emit, after the first skip of them,
// until the run's task ends (true), or the answer ends: the client went
// away, the server closes, emit failed, or the stream failed (false). n
// is the event's place among the runtime's events, from 0; drover's own
// events are left out. Quiet, it writes keepalive comments to w.
func (s *server) followRun(ctx context.Context, w io.Writer, rc *http.ResponseController, q *queue.Client, sp keyspace.Space, id string, skip int64, emit func(f followed, n int64) bool) bool {
	ended := stream.WhenEnded(func(ctx context.Context) bool {
		t, err := q.Get(ctx, id)
		return errors.Is(err, queue.ErrNotFound) || err == nil && t.CurrentStatus.Terminal()
	}, time.Second)
	// The runtime stores a run's events before its task's outcome and
	// asks for no Done, so no event can follow the end: the follower ends
	// at the check after the one that found it, not a Done's wait later.
	now := stream.SettleAfter(time.Nanosecond)
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	evs := make(chan followed)
	go func() { // ends with fctx, which ends when this answer does
		defer close(evs)
		for ev, err := range stream.HubFor(s.cfg.Etcd, sp).Follow(fctx, id, 0, ended, now) {
			select {
			case evs <- followed{ev, err}:
			case <-fctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(streamKeepalive)
	defer tick.Stop()
	closing := serverclose.Of(ctx)
	var seen int64 // the runtime's events followed so far: the next one's id
	for {
		var f followed
		var ok bool
		select {
		case <-ctx.Done():
			return false
		case <-closing: // the client reconnects with Last-Event-ID
			return false
		case <-tick.C:
			if _, err := io.WriteString(w, ": keepalive\n\n"); err != nil {
				return false
			}
			_ = rc.Flush()
			continue
		case f, ok = <-evs:
		}
		if !ok {
			return true
		}
		if f.err == nil && droverEvents[f.ev.Type] {
			continue
		}
		n := seen
		seen++
		if f.err == nil && n < skip {
			continue // the client had it
		}
		if !emit(f, n) || f.err != nil {
			return false
		}
		_ = rc.Flush()
	}
}

// followed is one event of a followed stream, or the error that ends it.
type followed struct {
	ev  stream.Event
	err error
}

// writeEvent writes f, a runtime's event, as a LangGraph SSE event of id
// n; false when the answer ends.
func writeEvent(w io.Writer, f followed, n int64) bool {
	if f.err != nil {
		raw, _ := json.Marshal(map[string]any{"error": "StreamError", "message": f.err.Error()})
		_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", raw)
		return false
	}
	data := f.ev.Data
	if len(data) == 0 {
		data = json.RawMessage("null")
	}
	_, err := fmt.Fprintf(w, "event: %s\ndata: %s\nid: %d\n\n", f.ev.Type, data, n)
	return err == nil
}

// streamKeepalive is how often a quiet SSE answer sends a comment, so that
// proxies and clients keep it open.
var streamKeepalive = 15 * time.Second

// lastEventID is how many of the runtime's events to skip, from
// Last-Event-ID: the id of the last one the client had (ids count from 0).
func lastEventID(h string) (int64, error) {
	if h == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(h), 10, 64)
	if err != nil {
		return 0, badInput("header.Last-Event-ID", h, "must be the id of an event of the stream, or -1 for the first")
	}
	return max(n+1, 0), nil
}

func (s *server) runStreamRoutes(api huma.API) {
	tags := []string{tagRuns}
	sse := map[string]*huma.Response{"200": {Description: "The run's events, as LangGraph's server-sent events.",
		Content: map[string]*huma.MediaType{"text/event-stream": {Schema: &huma.Schema{Type: "string"}}}}}
	huma.Register(api, huma.Operation{
		OperationID: "lg-stream-run", Method: http.MethodPost, Path: "/threads/{thread_id}/runs/stream", Tags: tags,
		Summary: "Create a run and stream its events (LangGraph)", Responses: sse,
		Errors: []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusNotImplemented},
	}, func(ctx context.Context, in *threadRunInput) (*huma.StreamResponse, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		r, err := s.startRun(ctx, id, in.Body)
		if err != nil {
			return nil, err
		}
		return s.streamRun(r.ThreadID, r.RunID, 0), nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-stream-stateless-run", Method: http.MethodPost, Path: "/runs/stream", Tags: tags,
		Summary: "Create a run on a thread of its own and stream its events (LangGraph)", Responses: sse,
		Errors: []int{http.StatusBadRequest, http.StatusNotFound, http.StatusNotImplemented},
	}, func(ctx context.Context, in *struct{ Body runBody }) (*huma.StreamResponse, error) {
		r, err := s.startRun(ctx, "", in.Body)
		if err != nil {
			return nil, err
		}
		return s.streamRun(r.ThreadID, r.RunID, 0), nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-join-run-stream", Method: http.MethodGet, Path: "/threads/{thread_id}/runs/{run_id}/stream", Tags: tags,
		Summary:     "Stream a run's events (LangGraph)",
		Description: "From the first event, or after the one Last-Event-ID names; until the run ends.",
		Responses:   sse, Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ThreadID           string   `path:"thread_id" doc:"The thread's id, a UUID."`
		RunID              string   `path:"run_id" doc:"The run's id, a UUID."`
		LastEventID        string   `header:"Last-Event-ID" doc:"Resume after this event."`
		StreamMode         []string `query:"stream_mode" doc:"Ignored: the run's own modes are streamed."`
		CancelOnDisconnect string   `query:"cancel_on_disconnect" doc:"Ignored: a run outlives its followers."`
	}) (*huma.StreamResponse, error) {
		th, id, err := runPath{in.ThreadID, in.RunID}.ids()
		if err != nil {
			return nil, err
		}
		from, err := lastEventID(in.LastEventID)
		if err != nil {
			return nil, err
		}
		if _, _, err := s.getRun(ctx, th, id); err != nil {
			return nil, err
		}
		return s.streamRun(th, id, from), nil
	})
	s.statelessJoinStreamRoute(api, tags, sse)
	s.threadStreamRoute(api)
}

// statelessJoinStreamRoute serves the join stream of a run named by its
// id alone.
func (s *server) statelessJoinStreamRoute(api huma.API, tags []string, sse map[string]*huma.Response) {
	huma.Register(api, huma.Operation{
		OperationID: "lg-join-stateless-run-stream", Method: http.MethodGet, Path: "/runs/{run_id}/stream", Tags: tags,
		Summary:     "Stream a run's events, the run named by its id alone (LangGraph)",
		Description: "As the thread's join stream, for a run found by its id.",
		Responses:   sse, Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		RunID              string   `path:"run_id" doc:"The run's id, a UUID."`
		LastEventID        string   `header:"Last-Event-ID" doc:"Resume after this event."`
		StreamMode         []string `query:"stream_mode" doc:"Ignored: the run's own modes are streamed."`
		CancelOnDisconnect string   `query:"cancel_on_disconnect" doc:"Ignored: a run outlives its followers."`
	}) (*huma.StreamResponse, error) {
		if !isUUID(in.RunID) {
			return nil, badInput("path.run_id", in.RunID, "must be a UUID")
		}
		id := strings.ToLower(in.RunID)
		from, err := lastEventID(in.LastEventID)
		if err != nil {
			return nil, err
		}
		th, err := s.threadOfRun(ctx, id)
		if err != nil {
			return nil, err
		}
		return s.streamRun(th, id, from), nil
	})
}

// threadOfRun is the thread of run id: from its task's parameters, else
// found by findRuns (the index of active runs, then the runs' keys, a
// page at a time).
func (s *server) threadOfRun(ctx context.Context, id string) (string, error) {
	q, err := s.queueOf(ctx)
	if err != nil {
		return "", err
	}
	defer closeQueue(q)
	if t, err := q.Get(ctx, id); err == nil {
		var p runTask
		if json.Unmarshal(t.Parameters, &p) == nil && p.Run.ThreadID != "" {
			return p.Run.ThreadID, nil
		}
	}
	found, err := s.findRuns(ctx, "", map[string]bool{id: true})
	if err != nil {
		return "", err
	}
	if r, ok := found[id]; ok {
		return r.thread, nil
	}
	return "", errRunNotFound(id)
}

// RunEvent is an event a run's start or outcome appends to the run
// task's stream, as POST /v1/tasks/{id}/stream/events takes it.
type RunEvent struct {
	Type string          `json:"type" minLength:"1" maxLength:"64" doc:"The event's type (metadata, values, ...); not one of drover's own (attempt_started, attempt_lost, attempt_ended, done)."`
	Data json.RawMessage `json:"data,omitempty" doc:"The event's value: any JSON value, at most 64 KiB with its type."`
}

// EventsAppended says where events a request appended went in the
// stream.
type EventsAppended struct {
	First int64 `json:"first" doc:"The sequence number of the first event appended."`
	Last  int64 `json:"last" doc:"The sequence number of the last."`
}

// runEventInputs are evs as the stream's writer takes them, checked as
// it checks them (stream.CheckInputs): a 400 naming the event and the
// rule, or a 413 for one over its bound; nothing is written then.
func runEventInputs(evs []RunEvent) ([]stream.Input, error) {
	ins := make([]stream.Input, len(evs))
	for i, e := range evs {
		ins[i] = stream.Input{Type: e.Type, Data: e.Data}
	}
	if err := stream.CheckInputs(ins); err != nil {
		return nil, runEventsProblem(err, "the request's", 0)
	}
	return ins, nil
}

// appendRunEvents appends ins to the stream of claim c's task under the
// claim, as the stream route does; what names them in an error.
func (s *server) appendRunEvents(ctx context.Context, sp keyspace.Space, c stream.Claim, ins []stream.Input, what string) (*EventsAppended, error) {
	first, last, err := stream.For(s.cfg.Etcd, sp).Append(ctx, c, ins)
	if err != nil {
		return nil, runEventsProblem(err, what, c.Fence.Token())
	}
	return &EventsAppended{First: first, Last: last}, nil
}

// runEventsProblem is the problem of an error of the stream's writer
// with a request's events (what names them), under token.
func runEventsProblem(err error, what string, token int64) error {
	var ie *drover.InputError
	switch {
	case errors.As(err, &ie):
		return badInput("body."+ie.Field, nil, ie.Rule)
	case errors.Is(err, stream.ErrStreamFull):
		return huma.NewError(http.StatusRequestEntityTooLarge, what+" events do not fit the run's stream: "+err.Error())
	case errors.Is(err, stream.ErrFenced):
		return huma.NewError(http.StatusConflict, fmt.Sprintf("%s events were not stored: this runtime no longer writes the run's stream under token %d: %v", what, token, err))
	case errors.Is(err, drover.ErrStoreFull):
		return storeFull(err)
	}
	return etcdError("appending "+what+" events to the run's stream", err)
}

// appendOutcomeEvents appends events ins of an outcome to the stream of
// claim c's task, but those a sending of the same outcome before stored
// (its answer lost): from is the seq the runtime expects the first of
// them to take, the one after the last event of its attempt it knows
// stored. Of the events of c's attempt the stream holds from there on
// (drover's own left out), the last k, when they are the first k of ins
// (type and data), are taken as stored already, the most k that match;
// the rest are appended. Events of the attempt there that are not ins'
// (a write of the runtime's stored twice, a from too early) are not
// counted: a repeat of an outcome whose events were all stored appends
// nothing, and no event of ins is left out that the stream does not hold.
//
// The rest go only right after the stream's last event as read
// (stream.Writer.AppendAfter): two sendings of one outcome at once (a
// retry while the first is still under way, on this member or another)
// cannot both append them; the one that finds the stream moved reads
// it again and finds its events there.
func (s *server) appendOutcomeEvents(ctx context.Context, sp keyspace.Space, c stream.Claim, from int64, ins []stream.Input) error {
	w := stream.For(s.cfg.Etcd, sp)
	for range maxAttempts {
		last, stored, err := s.outcomeEventsStored(ctx, sp, c, from, ins)
		if err != nil || stored >= len(ins) {
			return err
		}
		if hook := afterOutcomeRead.Load(); hook != nil {
			(*hook)(c.Task)
		}
		_, _, err = w.AppendAfter(ctx, c, last, ins[stored:])
		if errors.Is(err, stream.ErrMoved) {
			continue
		}
		if err != nil {
			return runEventsProblem(err, "the outcome's", c.Fence.Token())
		}
		return nil
	}
	return errRaced("the run's stream")
}

// afterOutcomeRead, when set (tests), is called with the task's id
// between an outcome's read of its run's stream and its append.
var afterOutcomeRead atomic.Pointer[func(task string)]

// outcomeEventsStored reads the stream of claim c's task for
// appendOutcomeEvents: its last seq, and how many of ins (the first
// stored) it holds from seq from on.
func (s *server) outcomeEventsStored(ctx context.Context, sp keyspace.Space, c stream.Claim, from int64, ins []stream.Input) (last int64, stored int, err error) {
	hub := stream.HubFor(s.cfg.Etcd, sp)
	last, err = hub.LastSeq(ctx, c.Task)
	if err != nil {
		return 0, 0, etcdError("reading the run's stream", err)
	}
	if last < from { // the common case, nothing stored from there, reads no more
		return last, 0, nil
	}
	var tail []stream.Event // the attempt's last events from there, at most len(ins) kept
	err = hub.Read(ctx, c.Task, from, func(evs []stream.Event) bool {
		for _, e := range evs {
			if e.Seq >= from && e.Attempt == c.Attempt && !droverEvents[e.Type] {
				if tail = append(tail, e); len(tail) > 2*len(ins) {
					tail = append(tail[:0], tail[len(tail)-len(ins):]...)
				}
			}
		}
		return true
	})
	if err != nil {
		return 0, 0, etcdError("reading the run's stream", err)
	}
	return last, storedPrefix(tail, ins), nil
}

// storedPrefix is the most k such that the last k events of tail are
// the first k of ins, their types and data as the stream stores them
// (compacted, HTML-escaped, null for none).
func storedPrefix(tail []stream.Event, ins []stream.Input) int {
	stored := make([][]byte, min(len(tail), len(ins)))
	for i := range stored {
		stored[i] = stream.StoredData(ins[i].Data)
	}
	for k := len(stored); k > 0; k-- {
		same := true
		for i, e := range tail[len(tail)-k:] {
			if e.Type != ins[i].Type || !bytes.Equal(stream.StoredData(e.Data), stored[i]) {
				same = false
				break
			}
		}
		if same {
			return k
		}
	}
	return 0
}

// outcomeEventInputs are outcome o's events, checked (runEventInputs),
// with the events_from they need.
func outcomeEventInputs(o runOutcome) ([]stream.Input, error) {
	if len(o.Events) > 0 && o.EventsFrom < 1 {
		return nil, badInput("body.events_from", o.EventsFrom, "must be given with events: the seq the first of them is to take (1 or more)")
	}
	return runEventInputs(o.Events)
}
