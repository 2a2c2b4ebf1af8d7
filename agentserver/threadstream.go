package agentserver

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/internal/serverclose"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The thread's join stream (GET /threads/{thread_id}/stream, the SDK's
// client.threads.joinStream) follows the thread's runs one after
// another, each from its first event: those not ended when it starts,
// then every run created after, in the order of their creation, as the
// watch of the thread's index of active runs gives them (a run that
// begins and ends while another is followed is followed after it, from
// its stream). Each event is sent as that run's join stream sends it,
// its id "{run_id}:{n}": Last-Event-ID resumes after that event of that
// run, then goes on with the runs created after it.

// threadStreamRoute serves the thread's join stream.
func (s *server) threadStreamRoute(api huma.API) {
	sse := map[string]*huma.Response{"200": {Description: "The events of the thread's runs, as LangGraph's server-sent events.",
		Content: map[string]*huma.MediaType{"text/event-stream": {Schema: &huma.Schema{Type: "string"}}}}}
	huma.Register(api, huma.Operation{
		OperationID: "lg-join-thread-stream", Method: http.MethodGet, Path: "/threads/{thread_id}/stream", Tags: []string{tagThreads},
		Summary:     "Stream the events of a thread's runs (LangGraph)",
		Description: "The run admitted now, from its first event, then each run admitted after it, until the client goes away; ids are run_id:n, and Last-Event-ID resumes after one. stream_mode run_modes only (the runs' own modes).",
		Responses:   sse, Errors: []int{http.StatusBadRequest, http.StatusNotFound, http.StatusNotImplemented},
	}, func(ctx context.Context, in *struct {
		ThreadID    string   `path:"thread_id" doc:"The thread's id, a UUID."`
		LastEventID string   `header:"Last-Event-ID" doc:"Resume after this event (run_id:n)."`
		StreamMode  []string `query:"stream_mode" doc:"run_modes (the default): the runs' events as their own stream modes make them; lifecycle and state_update are not served yet (501)."`
	}) (*huma.StreamResponse, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		for i, m := range in.StreamMode {
			if m != "run_modes" {
				return nil, notBuilt(fmt.Sprintf("query.stream_mode[%d]", i), "stream mode "+strconv.Quote(m)+" of a thread's stream")
			}
		}
		run, skip, err := threadEventID(in.LastEventID)
		if err != nil {
			return nil, err
		}
		if _, _, err := s.getThread(ctx, id); err != nil {
			return nil, err
		}
		return s.streamThread(id, run, skip), nil
	})
}

// threadEventID reads a thread stream's Last-Event-ID: the run and how
// many of its events the client had ("" and 0 for none).
func threadEventID(h string) (string, int64, error) {
	if h == "" {
		return "", 0, nil
	}
	run, n, ok := strings.Cut(strings.TrimSpace(h), ":")
	skip, err := lastEventID(n)
	if !ok || !isUUID(run) || err != nil {
		return "", 0, badInput("header.Last-Event-ID", h, "must be the id of an event of the thread's stream: run_id:n")
	}
	return strings.ToLower(run), skip, nil
}

// streamThread answers the thread's join stream: run (when it resumes
// one) after its first skip events, then each run created after it; or,
// without run, the thread's runs not ended, then each run created after.
func (s *server) streamThread(thread, run string, skip int64) *huma.StreamResponse {
	var runs []string
	var rev int64
	start := func(ctx context.Context, sp keyspace.Space) (err error) {
		runs, rev, err = s.threadStreamStart(ctx, sp, thread, run)
		return err
	}
	return s.sseAnswer("", start, func(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, q *queue.Client, sp keyspace.Space) {
		created := &createdRuns{s: s, sp: sp, thread: thread, rev: rev, seen: map[string]bool{}}
		for _, id := range runs {
			created.seen[id] = true
		}
		defer created.close()
		// The watch starts now, not once the first runs end: opened later
		// from rev, a compaction meanwhile would lose the runs created in
		// between. Its events wait in the client until poll or await.
		created.watch(ctx)
		for ctx.Err() == nil {
			if len(runs) == 0 {
				var ok bool
				if runs, ok = created.await(ctx, w, rc); !ok {
					return
				}
				continue
			}
			id := runs[0]
			runs = runs[1:]
			if err := s.awaitAdmitted(ctx, thread, id); err != nil { // an enqueued run: until it starts
				_ = writeEvent(w, followed{err: err}, 0)
				return
			}
			from := int64(0)
			if id == run {
				from = skip
			}
			emit := func(f followed, n int64) bool { return writeThreadEvent(w, f, id, n) }
			if !s.followRun(ctx, w, rc, q, sp, id, from, emit) {
				return
			}
			runs = append(runs, created.poll(ctx)...)
		}
	})
}

// threadStreamStart is where a thread's stream starts: the runs to
// follow first, and the revision after which the runs created come by
// the watch. Resuming run, that is run alone and the revision of its
// creation (a run gone: none, and now); else the thread's runs not
// ended, oldest first, and the revision of that read.
func (s *server) threadStreamStart(ctx context.Context, sp keyspace.Space, thread, run string) ([]string, int64, error) {
	if run != "" {
		g, err := s.cfg.Etcd.Get(ctx, sp.AgentRun(thread, run), clientv3.WithKeysOnly())
		if err != nil {
			return nil, 0, etcdError("reading the run", err)
		}
		if len(g.Kvs) > 0 {
			return []string{run}, g.Kvs[0].CreateRevision, nil
		}
	}
	if err := s.ensureRunIndex(ctx, sp); err != nil {
		return nil, 0, err
	}
	g, err := s.cfg.Etcd.Get(ctx, sp.AgentActiveRuns(thread), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(maxStopped+1))
	if err != nil {
		return nil, 0, etcdError("reading the thread's active runs", err)
	}
	var runs []string
	for _, kv := range g.Kvs {
		runs = append(runs, idOf(kv.Key))
	}
	return runs, g.Header.Revision, nil
}

// createdRuns are the runs created on a thread after a revision, in the
// order of their creation, from a watch of the thread's index of active
// runs (each run's key is put once, when it is created).
type createdRuns struct {
	s      *server
	sp     keyspace.Space
	thread string
	rev    int64 // the last revision seen
	seen   map[string]bool
	wch    clientv3.WatchChan
	cancel context.CancelFunc
}

func (c *createdRuns) close() {
	if c.cancel != nil {
		c.cancel()
	}
}

// take reads the ids of the runs created in wr.
func (c *createdRuns) take(wr clientv3.WatchResponse) []string {
	var ids []string
	for _, ev := range wr.Events {
		c.rev = max(c.rev, ev.Kv.ModRevision)
		if id := idOf(ev.Kv.Key); ev.Type == clientv3.EventTypePut && !c.seen[id] {
			c.seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// watch (re)opens the watch from the revision after the last seen.
func (c *createdRuns) watch(ctx context.Context) {
	if c.wch != nil {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	c.wch = c.s.cfg.Etcd.Watch(clientv3.WithRequireLeader(wctx), c.sp.AgentActiveRuns(c.thread), clientv3.WithPrefix(), clientv3.WithRev(c.rev+1))
}

// poll is the runs created the watch has told of so far, without waiting.
func (c *createdRuns) poll(ctx context.Context) []string {
	var ids []string
	for c.wch != nil {
		select {
		case wr, ok := <-c.wch:
			if !ok || wr.Err() != nil {
				return append(ids, c.reset(ctx, wr)...)
			}
			ids = append(ids, c.take(wr)...)
		default:
			return ids
		}
	}
	return ids
}

// reset drops a watch that ended; the next opens another after the
// last revision seen. When etcd compacted past it, the runs created
// before the compaction come from their records instead (those of the
// thread created since, oldest first, at most maxCaughtUp: the rest are
// not followed), and the next watch opens after the compaction.
func (c *createdRuns) reset(ctx context.Context, wr clientv3.WatchResponse) []string {
	c.close()
	c.wch, c.cancel = nil, nil
	if wr.CompactRevision <= c.rev+1 {
		return nil
	}
	g, err := c.s.cfg.Etcd.Get(ctx, c.sp.AgentRuns(c.thread), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithMinCreateRev(c.rev+1), clientv3.WithMaxCreateRev(wr.CompactRevision-1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(maxCaughtUp))
	if err != nil {
		return nil // the watch opens again from c.rev, and fails again: read again then
	}
	var ids []string
	for _, kv := range g.Kvs {
		if id := idOf(kv.Key); !c.seen[id] {
			c.seen[id] = true
			ids = append(ids, id)
		}
	}
	c.rev = wr.CompactRevision - 1
	return ids
}

// maxCaughtUp bounds the runs a thread stream reads from their records
// when etcd compacted its watch's history (see reset).
const maxCaughtUp = 1000

// await waits for runs created, writing keepalives to w meanwhile; false
// when the answer ends (the client went away, the server closes).
func (c *createdRuns) await(ctx context.Context, w io.Writer, rc *http.ResponseController) ([]string, bool) {
	tick := time.NewTicker(streamKeepalive)
	defer tick.Stop()
	closing := serverclose.Of(ctx)
	for {
		c.watch(ctx)
		select {
		case <-ctx.Done():
			return nil, false
		case <-closing:
			return nil, false
		case <-tick.C:
			if _, err := io.WriteString(w, ": keepalive\n\n"); err != nil {
				return nil, false
			}
			_ = rc.Flush()
		case wr, ok := <-c.wch:
			if !ok || wr.Err() != nil {
				if ids := c.reset(ctx, wr); len(ids) > 0 {
					return ids, true
				}
				select { // a watch that ends (no leader) is opened again after a while: never a spin
				case <-ctx.Done():
					return nil, false
				case <-time.After(admitRecheck):
				}
				continue
			}
			if ids := c.take(wr); len(ids) > 0 {
				return ids, true
			}
		}
	}
}

// writeThreadEvent writes f, an event of run, as a thread stream's SSE
// event of id run:n; false when the answer ends.
func writeThreadEvent(w io.Writer, f followed, run string, n int64) bool {
	if f.err != nil {
		return writeEvent(w, f, n)
	}
	var b strings.Builder
	if !writeEvent(&b, f, n) {
		return false
	}
	// writeEvent ends with "id: n\n\n": the thread's ids name the run.
	out := strings.TrimSuffix(b.String(), "id: "+strconv.FormatInt(n, 10)+"\n\n") + "id: " + run + ":" + strconv.FormatInt(n, 10) + "\n\n"
	_, err := io.WriteString(w, out)
	return err == nil
}
