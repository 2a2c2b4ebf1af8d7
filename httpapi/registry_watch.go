package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/internal/serverclose"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/registry"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Stream timing: a comment line every streamKeepalive keeps proxies from
// closing an idle stream (and finds a client that went away); a write that
// takes longer than streamWriteTimeout ends the stream.
var (
	streamKeepalive    = 15 * time.Second
	streamWriteTimeout = 10 * time.Second
)

// WatchSnapshot is the first event of a watch: the live endpoints and the
// revision they were read at. Its SSE id is that revision.
type WatchSnapshot struct {
	Revision  int64          `json:"revision" doc:"The etcd revision the endpoints were read at; the events that follow come after it."`
	Endpoints []EndpointBody `json:"endpoints" doc:"The live endpoints."`
}

// WatchEvent is one change of a watched component: an endpoint written
// (put) or removed (delete: withdrawn, or its session or lease ended).
type WatchEvent struct {
	Type     string       `json:"type" enum:"put,delete" doc:"put: registered or rewritten; delete: gone."`
	Revision int64        `json:"revision" doc:"The etcd revision of the change; several changes may share one (a lease's end removes all its endpoints at once)."`
	Endpoint EndpointBody `json:"endpoint" doc:"The endpoint as written, or as it was before it went (at least its component and id)."`
}

// WatchEnd is the last event of a stream the server cannot go on with.
type WatchEnd struct {
	Reason string `json:"reason" enum:"compacted,unavailable" doc:"compacted: etcd no longer holds the changes after the last event id (reconnect without Last-Event-ID for a fresh snapshot); unavailable: the watch broke (reconnect with Last-Event-ID)."`
	Detail string `json:"detail" doc:"What happened, and what to do."`
}

type watchInput struct {
	Component   string `path:"component" doc:"The component to follow."`
	LastEventID string `header:"Last-Event-ID" doc:"Resume after this event id (an etcd revision): every change after it is sent, without a snapshot. 410 when etcd compacted it away."`
}

const watchDescription = "A Server-Sent Events stream. Without Last-Event-ID: a `snapshot` event (the live endpoints), then a `put` or " +
	"`delete` event for every change, in revision order, each change exactly once. The SSE id of an event is the etcd revision after " +
	"which the stream resumes: it is set on the snapshot and on the last event of each revision, so a client that reconnects with " +
	"Last-Event-ID (browsers' EventSource does) gets every later change and nothing twice. 410 when that revision was compacted away: " +
	"reconnect without it. An `end` event says why a stream stopped early. A comment line every 15 s keeps idle streams open."

func (s *Server) watchRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "watch-endpoints", Method: http.MethodGet, Path: "/v1/registry/{component}/watch", Tags: []string{"registry"},
		Summary:     "Follow a component's endpoints: a snapshot, then every change (Server-Sent Events)",
		Description: watchDescription,
		Errors:      []int{http.StatusBadRequest, http.StatusGone},
		Responses: map[string]*huma.Response{"200": {
			Description: "An event stream: events snapshot (WatchSnapshot), put and delete (WatchEvent), end (WatchEnd).",
			Content: map[string]*huma.MediaType{"text/event-stream": {Schema: &huma.Schema{
				Type: huma.TypeString, Description: "event: snapshot|put|delete|end, id: revision, data: one JSON object per event",
			}}},
		}},
	}, s.watchEndpoints)
}

func (s *Server) watchEndpoints(ctx context.Context, in *watchInput) (*huma.StreamResponse, error) {
	if err := checkKeyName("path.component", in.Component); err != nil {
		return nil, err
	}
	ns := s.nsOf(ctx)
	keys := s.keys(ctx)
	prefix := keys.ComponentEndpoints(in.Component)
	var snap *WatchSnapshot
	var from int64
	if in.LastEventID != "" {
		rev, err := strconv.ParseInt(in.LastEventID, 10, 64)
		if err != nil || rev < 1 {
			return nil, invalid("header.Last-Event-ID", in.LastEventID, "must be the id of an event of this stream: a positive etcd revision")
		}
		if err := s.resumable(ctx, prefix, rev); err != nil {
			return nil, err
		}
		from = rev
	} else {
		list, rev, err := registry.List(ctx, s.cli, ns, in.Component)
		if err != nil {
			return nil, problem(err, nil)
		}
		snap = &WatchSnapshot{Revision: rev, Endpoints: make([]EndpointBody, len(list))}
		for i, e := range list {
			snap.Endpoints[i] = endpointBodyOf(e)
		}
		from = rev
	}
	return &huma.StreamResponse{Body: func(hctx huma.Context) {
		ctx, w, ok := startStream(hctx)
		if !ok {
			return
		}
		st := &eventStream{w: w, rc: http.NewResponseController(w)}
		s.stream(ctx, st, keys, prefix, from, snap)
	}}, nil
}

// resumable checks that the changes after rev are still in etcd: 410 when
// compacted away, 400 when rev is past the store's revision.
func (s *Server) resumable(ctx context.Context, prefix string, rev int64) error {
	_, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithCountOnly())
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return newProblem(http.StatusGone, "compacted", fmt.Sprintf("etcd no longer holds the changes after revision %d (compacted): "+
			"reconnect without Last-Event-ID for a fresh snapshot", rev))
	case errors.Is(err, rpctypes.ErrFutureRev):
		return invalid("header.Last-Event-ID", rev, "is past the store's current revision: not an id of this server's streams")
	case err != nil:
		return problem(err, nil)
	}
	return nil
}

// stream writes the snapshot (if any) and then every change under prefix
// after revision from, until the client goes away, the server closes, or
// the watch breaks.
func (s *Server) stream(ctx context.Context, st *eventStream, keys keyspace.Space, prefix string, from int64, snap *WatchSnapshot) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if closing := serverclose.Of(ctx); closing != nil {
		go func() {
			select {
			case <-closing:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	wch := s.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1), clientv3.WithPrevKV())
	st.w.Header().Set("Content-Type", "text/event-stream")
	st.w.Header().Set("Cache-Control", "no-cache")
	st.w.Header().Set("X-Accel-Buffering", "no")
	st.w.WriteHeader(http.StatusOK)
	if snap != nil {
		if st.send("snapshot", snap.Revision, snap) != nil {
			return
		}
	} else if st.comment("resumed after "+strconv.FormatInt(from, 10)) != nil {
		return
	}
	tick := time.NewTicker(streamKeepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if st.comment("keepalive") != nil {
				return
			}
		case resp, ok := <-wch:
			if !ok || ctx.Err() != nil {
				return
			}
			if resp.CompactRevision != 0 {
				_ = st.send("end", 0, WatchEnd{Reason: "compacted", Detail: fmt.Sprintf("etcd compacted the changes up to revision %d before they could be sent: reconnect without Last-Event-ID for a fresh snapshot", resp.CompactRevision)})
				return
			}
			if err := resp.Err(); err != nil {
				_ = st.send("end", 0, WatchEnd{Reason: "unavailable", Detail: "the watch broke (" + err.Error() + "): reconnect with Last-Event-ID to resume"})
				return
			}
			if st.changes(keys, resp.Events) != nil {
				return
			}
		}
	}
}

// eventStream writes Server-Sent Events to one client.
type eventStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// changes writes one event per endpoint change; the SSE id goes on the last
// event of each revision only, so that a client resuming from it has every
// change of that revision.
func (st *eventStream) changes(keys keyspace.Space, evs []*clientv3.Event) error {
	out := make([]WatchEvent, 0, len(evs))
	for _, ev := range evs {
		kv := ev.Kv
		typ := "put"
		if ev.Type == mvccpb.DELETE {
			typ = "delete"
			if ev.PrevKv != nil {
				kv = ev.PrevKv
			}
		}
		in, ok := registry.Decode(keys, kv)
		if !ok {
			continue
		}
		if typ == "delete" {
			in.ModRevision = ev.Kv.ModRevision
		}
		out = append(out, WatchEvent{Type: typ, Revision: ev.Kv.ModRevision, Endpoint: endpointBodyOf(in)})
	}
	for i, e := range out {
		var id int64
		if i == len(out)-1 || out[i+1].Revision != e.Revision {
			id = e.Revision
		}
		if err := st.send(e.Type, id, e); err != nil {
			return err
		}
	}
	return nil
}

// send writes one event (id 0: none) and flushes it.
func (st *eventStream) send(event string, id int64, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode a %s event: %w", event, err)
	}
	msg := make([]byte, 0, len(b)+64)
	if id > 0 {
		msg = fmt.Appendf(msg, "id: %d\n", id)
	}
	msg = fmt.Appendf(msg, "event: %s\ndata: %s\n\n", event, b)
	return st.write(msg)
}

// comment writes an SSE comment line, which clients ignore.
func (st *eventStream) comment(text string) error { return st.write([]byte(": " + text + "\n\n")) }

func (st *eventStream) write(msg []byte) error {
	_ = st.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)) // not every writer has one
	if _, err := st.w.Write(msg); err != nil {
		return fmt.Errorf("write to the stream: %w", err)
	}
	if err := st.rc.Flush(); err != nil {
		return fmt.Errorf("flush the stream: %w", err)
	}
	return nil
}
