package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/internal/serverclose"
)

// EventsSnapshot is the first event of GET /v1/events, and the whole
// answer to a client that does not accept text/event-stream.
type EventsSnapshot struct {
	Namespace string         `json:"namespace" doc:"The namespace followed: the request's Drover-Namespace, else the server's."`
	Queues    []QueueSummary `json:"queues" doc:"Every queue with its counts and settings, as GET /v1/queues."`
	At        time.Time      `json:"at" doc:"When it was read."`
}

// QueuesEvent carries every queue's counts after one of them changed.
type QueuesEvent struct {
	Queues []QueueSummary `json:"queues" doc:"Every queue with its counts and settings, as GET /v1/queues."`
}

// ChangedEvent names what changed besides the queues: read it again from
// its routes.
type ChangedEvent struct {
	Topics []string `json:"topics" doc:"locks (GET /v1/locks), registry (GET /v1/registry, GET /v1/workers) or flow (GET /v1/limits, /v1/quotas, /v1/breakers)."`
}

// EventsEnd is the last event of a stream that the server ends.
type EventsEnd struct {
	Reason string `json:"reason" enum:"closing,busy" doc:"closing: the server shuts down (reconnect, to it or another); busy: the server follows as many namespaces as it may (try again later)."`
	Detail string `json:"detail" doc:"What happened, and what to do."`
}

type eventsInput struct {
	Accept string `header:"Accept" doc:"text/event-stream for the stream; anything else gets the snapshot alone, as JSON."`
}

const eventsDescription = "A Server-Sent Events stream of what the dashboard shows, for the request's namespace: a `snapshot` " +
	"event (every queue with its counts), then a `queues` event whenever a count changes, a `changed` event naming the other " +
	"topics that changed (locks, registry, flow: read them again from their routes), and a `sample` event with each new sample " +
	"of GET /v1/stats/history. The server reads the counts once a second while anyone follows the namespace, with one goroutine " +
	"whatever the number of streams, so a busy queue costs no more than an idle one and changes within a second are merged. " +
	"The stream carries the state, not a log: a client that reconnects gets a new snapshot (there are no event ids). A comment " +
	"line every 15 s keeps idle streams open; an `end` event says why the server ended one. Without text/event-stream in " +
	"Accept the answer is the snapshot alone, as JSON."

func (s *Server) eventRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "follow-events", Method: http.MethodGet, Path: "/v1/events", Tags: []string{"dashboard"},
		Summary:     "Follow the namespace's queue counts and changes (Server-Sent Events)",
		Description: eventsDescription,
		Responses: map[string]*huma.Response{"200": {
			Description: "An event stream: events snapshot (EventsSnapshot), queues (QueuesEvent), changed (ChangedEvent), " +
				"sample (StatsSample), end (EventsEnd); or, without text/event-stream in Accept, the snapshot as JSON.",
			Content: map[string]*huma.MediaType{
				"text/event-stream": {Schema: &huma.Schema{Type: huma.TypeString, Description: "event: snapshot|queues|changed|sample|end, data: one JSON object per event"}},
				"application/json":  {Schema: s.api.OpenAPI().Components.Schemas.Schema(reflectEventsSnapshot, true, "EventsSnapshot")},
			},
		}},
	}, s.followEvents)
	// The events' own types, for clients generated from the document.
	for _, t := range reflectEventTypes {
		s.api.OpenAPI().Components.Schemas.Schema(t, true, "")
	}
}

func (s *Server) followEvents(ctx context.Context, in *eventsInput) (*huma.StreamResponse, error) {
	qs, err := s.queueSummaries(ctx)
	if err != nil {
		return nil, err
	}
	snap := EventsSnapshot{Namespace: s.nsOf(ctx), Queues: qs, At: time.Now().UTC()}
	stream := strings.Contains(in.Accept, "text/event-stream")
	return &huma.StreamResponse{Body: func(hctx huma.Context) {
		ctx, w, ok := startStream(hctx)
		if !ok {
			return
		}
		if !stream {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_ = json.NewEncoder(w).Encode(snap)
			return
		}
		st := &eventStream{w: w, rc: http.NewResponseController(w)}
		s.streamEvents(ctx, st, snap)
	}}, nil
}

// streamEvents writes the snapshot, then what the hub posts, until the
// client goes away, the server closes, or the hub stops.
func (s *Server) streamEvents(ctx context.Context, st *eventStream, snap EventsSnapshot) {
	sub, cancel := s.hub.subscribe(snap.Namespace)
	defer cancel()
	st.w.Header().Set("Content-Type", "text/event-stream")
	st.w.Header().Set("Cache-Control", "no-cache")
	st.w.Header().Set("X-Accel-Buffering", "no")
	st.w.WriteHeader(http.StatusOK)
	if st.send("snapshot", 0, snap) != nil {
		return
	}
	if sub == nil {
		_ = st.send("end", 0, EventsEnd{Reason: "busy", Detail: "this server follows as many namespaces as it may; try again later, or ask another server"})
		return
	}
	closing := serverclose.Of(ctx) // nil (never ready) when the request names no http.Server
	tick := time.NewTicker(streamKeepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-closing:
			_ = st.send("end", 0, EventsEnd{Reason: "closing", Detail: "the server shuts down: reconnect"})
			return
		case <-s.hub.done:
			_ = st.send("end", 0, EventsEnd{Reason: "closing", Detail: "the server shuts down: reconnect"})
			return
		case <-tick.C:
			if st.comment("keepalive") != nil {
				return
			}
		case <-sub.wake:
			if sendPosted(st, sub) != nil {
				return
			}
		}
	}
}

// sendPosted writes what the hub posted to sub since the last time.
func sendPosted(st *eventStream, sub *subscriber) error {
	qs, topics, samples := sub.take()
	if qs != nil {
		if err := st.send("queues", 0, QueuesEvent{Queues: qs}); err != nil {
			return err
		}
	}
	if len(topics) > 0 {
		if err := st.send("changed", 0, ChangedEvent{Topics: topics}); err != nil {
			return err
		}
	}
	for _, smp := range samples {
		if err := st.send("sample", 0, smp); err != nil {
			return err
		}
	}
	return nil
}

var (
	reflectEventsSnapshot = reflect.TypeFor[EventsSnapshot]()
	reflectEventTypes     = []reflect.Type{reflect.TypeFor[QueuesEvent](), reflect.TypeFor[ChangedEvent](),
		reflect.TypeFor[StatsSample](), reflect.TypeFor[EventsEnd]()}
)
