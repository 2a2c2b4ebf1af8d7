package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/internal/serverclose"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The stops of running runs, pushed to runtimes (GET
// /v1/agent-server/runs/stops). Every stop of a run (a cancel, a new
// run's interrupt or rollback) cancels its task, and the queue's cancel
// of a claimed task puts the task's cancel signal
// (keyspace.CancelTask: queues/langgraph/cancel/{id}, under a 60 s
// lease), which drover's own queue workers watch. This stream is that
// watch over HTTP, for the namespace's runs queue: a runtime opens one
// and matches the task ids against the runs it runs, instead of reading
// each running run's task every while. A stop is sent whether or not
// the runtime runs the task: the stream knows no runtime's tasks, so a
// runtime whose worker renews its session keeps its one stream.
//
// Nothing is missed: a stream opened without Last-Event-ID first sends
// the signals present (the tasks cancelled while claimed in the last
// minute, read at one revision), then `ready` with that revision, then
// every signal after it; reopened with Last-Event-ID (the id of `ready`
// or of a stop), it sends every signal after that revision, on whichever
// server of the cluster answers. A revision etcd compacted away answers
// 410 (or ends a stream with `end`, reason compacted): the client opens
// a fresh stream and reads once the tasks it runs, as it did before.

// RunStop is one stopped run: its task's cancel (the task of a run is
// the run's id).
type RunStop struct {
	TaskID   string `json:"task_id" doc:"The cancelled task: the run's id."`
	RunID    string `json:"run_id" doc:"The run's id (the same as task_id)."`
	Revision int64  `json:"revision" doc:"The etcd revision of the task's cancel."`
}

// RunStopsReady says that the stream is live: every stop after Revision
// comes.
type RunStopsReady struct {
	Revision int64 `json:"revision" doc:"Every stop after this revision comes on this stream; its SSE id is this revision."`
	Resumed  bool  `json:"resumed" doc:"true when the stream resumed after Last-Event-ID (no snapshot was sent)."`
}

// runStopsDescription is the route's description in the OpenAPI document.
const runStopsDescription = "For runtimes: one Server-Sent Events stream per runtime replaces reading each running run's task to see a cancel. " +
	"Every stop of a run of the namespace (a cancel, a new run's interrupt or rollback: each cancels the run's task) is a `stop` event " +
	"{task_id, run_id, revision}, for every claimed task of the langgraph queue; the runtime keeps those of the tasks it runs. " +
	"Without Last-Event-ID the stream first sends a `stop` for each task cancelled while claimed in the last minute, then `ready` " +
	"{revision, resumed}; with Last-Event-ID (an event's id: an etcd revision) it sends `ready` and every stop after that revision, " +
	"on whichever server answers; 410 when etcd compacted that revision away (reopen without it and read the tasks run once). " +
	"An `end` event {reason: compacted|unavailable, detail} says why a stream stopped early. A comment line every keepalive seconds " +
	"(default 15) shows the connection alive. The stream ends when the client goes away or the server closes."

// runStopsInput is what the route takes.
type runStopsInput struct {
	LastEventID string `header:"Last-Event-ID" doc:"Resume after this event id (an etcd revision): every stop after it, and no snapshot. 410 when compacted away."`
	Keepalive   int    `query:"keepalive" minimum:"1" maximum:"60" doc:"Seconds between keepalive comments; default 15."`
}

// runStopsOpen counts the stop streams open on this server (tests).
var runStopsOpen atomic.Int64

func (s *server) runStopsRoute(api huma.API) {
	huma.Register(api, huma.Operation{
		OperationID: "agent-server-run-stops", Method: http.MethodGet, Path: "/v1/agent-server/runs/stops", Tags: []string{tagRuns},
		Summary:     "Follow the stops of the namespace's runs (Server-Sent Events, for runtimes)",
		Description: runStopsDescription,
		Errors:      []int{http.StatusBadRequest, http.StatusGone},
		Responses: map[string]*huma.Response{"200": {
			Description: "An event stream: stop (RunStop), ready (RunStopsReady), end ({reason, detail}).",
			Content: map[string]*huma.MediaType{"text/event-stream": {Schema: &huma.Schema{
				Type: huma.TypeString, Description: "event: stop|ready|end, id: revision, data: one JSON object per event",
			}}},
		}},
	}, func(ctx context.Context, in *runStopsInput) (*huma.StreamResponse, error) {
		sp, err := s.space(ctx)
		if err != nil {
			return nil, err
		}
		prefix := sp.QueueCancel(RunsQueue)
		var from int64
		if in.LastEventID != "" {
			if from, err = s.stopsResumable(ctx, prefix, in.LastEventID); err != nil {
				return nil, err
			}
		}
		every := streamKeepalive
		if in.Keepalive > 0 {
			every = time.Duration(in.Keepalive) * time.Second
		}
		return &huma.StreamResponse{Body: func(hctx huma.Context) {
			ctx, w, req := longContext(hctx)
			runStopsOpen.Add(1)
			defer runStopsOpen.Add(-1)
			s.streamStops(ctx, w, req, prefix, from, every)
		}}, nil
	})
}

// stopsResumable reads Last-Event-ID: the revision after which the stops
// are sent, when etcd still holds the changes after it (410 when
// compacted away, 400 when it is no revision of the store).
func (s *server) stopsResumable(ctx context.Context, prefix, h string) (int64, error) {
	rev, err := strconv.ParseInt(strings.TrimSpace(h), 10, 64)
	if err != nil || rev < 1 {
		return 0, badInput("header.Last-Event-ID", h, "must be the id of an event of this stream: a positive etcd revision")
	}
	_, err = s.cfg.Etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithCountOnly())
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return 0, huma.NewError(http.StatusGone, fmt.Sprintf("etcd no longer holds the changes after revision %d (compacted): "+
			"open the stream without Last-Event-ID, and read the tasks run once", rev))
	case errors.Is(err, rpctypes.ErrFutureRev):
		return 0, badInput("header.Last-Event-ID", h, "is past the store's current revision: not an id of this server's streams")
	case err != nil:
		return 0, etcdError("reading the runs' stops", err)
	}
	return rev, nil
}

// streamStops answers the stream: without from, the signals present
// and ready at the revision they were read at; with it, ready at from.
// Then every signal after it (follow).
func (s *server) streamStops(ctx context.Context, w http.ResponseWriter, req *http.Request, prefix string, from int64, every time.Duration) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resumed := from > 0
	var page *clientv3.GetResponse
	if !resumed {
		var err error
		if page, err = s.stopsPage(ctx, prefix, prefix, 0); err != nil {
			writeError(w, req, err)
			return
		}
		from = page.Header.Revision
	}
	// Opened before anything is written: a compaction while the snapshot
	// is sent cannot lose the stops after from.
	wch := s.cfg.Etcd.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithRev(from+1))
	st := &stopWriter{w: w, rc: http.NewResponseController(w)}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// The snapshot a page at a time, every page at from: one page in
	// memory however many runs a cancel of many stopped.
	for page != nil {
		for _, kv := range page.Kvs {
			id := strings.TrimPrefix(string(kv.Key), prefix)
			if st.send("stop", 0, RunStop{TaskID: id, RunID: id, Revision: kv.ModRevision}) != nil {
				return
			}
		}
		if !page.More || len(page.Kvs) == 0 {
			break
		}
		var err error
		if page, err = s.stopsPage(ctx, prefix, string(page.Kvs[len(page.Kvs)-1].Key)+"\x00", from); err != nil {
			_ = st.send("end", 0, map[string]string{"reason": "unavailable", "detail": "reading the stops present failed (" + err.Error() + "): reopen the stream"})
			return
		}
	}
	if st.send("ready", from, RunStopsReady{Revision: from, Resumed: resumed}) != nil {
		return
	}
	st.follow(ctx, prefix, wch, every)
}

// stopsPage reads a page of the cancel signals under prefix from key on
// (at revision rev, unless 0). A signal lasts a minute (its lease): a
// stop older than that is not among them.
func (s *server) stopsPage(ctx context.Context, prefix, key string, rev int64) (*clientv3.GetResponse, error) {
	opts := []clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithKeysOnly(), clientv3.WithLimit(runPage)}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := s.cfg.Etcd.Get(ctx, key, opts...)
	if err != nil {
		return nil, etcdError("reading the runs' stops", err)
	}
	return resp, nil
}

// follow sends the signals wch tells of, and a keepalive comment every
// while, until the client goes, the server closes or the watch breaks.
func (st *stopWriter) follow(ctx context.Context, prefix string, wch clientv3.WatchChan, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	closing := serverclose.Of(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-closing: // the client reopens with Last-Event-ID, on this server or another
			return
		case <-tick.C:
			if st.write([]byte(": keepalive\n\n")) != nil {
				return
			}
		case wr, ok := <-wch:
			if !ok || ctx.Err() != nil || !st.watched(prefix, wr) {
				return
			}
		}
	}
}

// stopWriter writes a stop stream's events to one client.
type stopWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// watched writes the stops of one watch answer (the SSE id on the last
// of each revision, so that a client resuming from it has them all), or
// the end of the stream when the watch broke; false when the stream
// ends.
func (st *stopWriter) watched(prefix string, wr clientv3.WatchResponse) bool {
	if wr.CompactRevision != 0 {
		_ = st.send("end", 0, map[string]string{"reason": "compacted", "detail": fmt.Sprintf(
			"etcd compacted the changes up to revision %d before they could be sent: open the stream without Last-Event-ID, and read the tasks run once", wr.CompactRevision)})
		return false
	}
	if err := wr.Err(); err != nil {
		_ = st.send("end", 0, map[string]string{"reason": "unavailable", "detail": "the watch broke (" + err.Error() + "): reopen the stream with Last-Event-ID"})
		return false
	}
	for i, ev := range wr.Events {
		id := strings.TrimPrefix(string(ev.Kv.Key), prefix)
		var sseID int64
		if i == len(wr.Events)-1 || wr.Events[i+1].Kv.ModRevision != ev.Kv.ModRevision {
			sseID = ev.Kv.ModRevision
		}
		if st.send("stop", sseID, RunStop{TaskID: id, RunID: id, Revision: ev.Kv.ModRevision}) != nil {
			return false
		}
	}
	return true
}

// send writes one event (id 0: none) and flushes it.
func (st *stopWriter) send(event string, id int64, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	msg := make([]byte, 0, len(b)+64)
	if id > 0 {
		msg = fmt.Appendf(msg, "id: %d\n", id)
	}
	msg = fmt.Appendf(msg, "event: %s\ndata: %s\n\n", event, b)
	return st.write(msg)
}

// stopWriteTimeout ends a stream whose client takes longer than this to
// take a write: what the watch holds meanwhile stays bounded.
const stopWriteTimeout = 10 * time.Second

func (st *stopWriter) write(msg []byte) error {
	_ = st.rc.SetWriteDeadline(time.Now().Add(stopWriteTimeout)) // not every writer has one
	if _, err := st.w.Write(msg); err != nil {
		return err
	}
	return st.rc.Flush()
}
