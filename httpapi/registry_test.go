package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/registry"
	"github.com/prometheus/client_golang/prometheus"
)

// sseEvent is one Server-Sent Event as a client reads it.
type sseEvent struct {
	ID    string // "" when the event carried none
	Event string
	Data  map[string]any
}

// sseStream is an open watch: its events arrive on Events until the stream
// ends (the channel is then closed); Close disconnects.
type sseStream struct {
	Status int
	Header http.Header
	Events chan sseEvent
	cancel context.CancelFunc
	done   chan struct{}
}

// watch opens GET path as an event stream; lastID, when set, is sent as
// Last-Event-ID. A status other than 200 is returned with no events.
func (a *api) watch(path, lastID string) *sseStream {
	a.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", a.base+path, nil)
	req.Header.Set(httpapi.NamespaceHeader, a.ns)
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	hc := &http.Client{} // no timeout: a stream lasts
	r, err := hc.Do(req)
	if err != nil {
		cancel()
		a.t.Fatal(err)
	}
	st := &sseStream{Status: r.StatusCode, Header: r.Header, Events: make(chan sseEvent, 1024), cancel: cancel, done: make(chan struct{})}
	a.t.Cleanup(st.Close)
	if r.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		close(st.Events)
		close(st.done)
		return st
	}
	go func() {
		defer close(st.done)
		defer close(st.Events)
		defer r.Body.Close()
		br := bufio.NewReader(r.Body)
		var ev sseEvent
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case line == "":
				if ev.Event != "" {
					st.Events <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.ID = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				ev.Event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.Data)
			}
		}
	}()
	return st
}

// Close disconnects and waits for the reader to end.
func (s *sseStream) Close() {
	s.cancel()
	<-s.done
}

// next returns the next event, failing the test after d.
func (s *sseStream) next(t *testing.T, d time.Duration) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-s.Events:
		if !ok {
			t.Fatal("the stream ended")
		}
		return ev
	case <-time.After(d):
		t.Fatalf("no event within %s", d)
	}
	return sseEvent{}
}

// endpointOf is the endpoint of a put or delete event.
func (e sseEvent) endpointOf() map[string]any { m, _ := e.Data["endpoint"].(map[string]any); return m }

// TestRegistryRegister: an endpoint is registered under a session (201),
// registered again by it (200, same create revision), refused to another
// session (409), read, listed, and withdrawn only by its own session.
func TestRegistryRegister(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s1, s2 := a.session(30), a.session(30)
	body := map[string]any{"session": s1, "address": "10.0.0.5:8000", "data": map[string]any{"kv_active_blocks": 1000}}
	r := a.do("PUT", "/v1/registry/VllmWorker/gpu-0", body).want(t, 201)
	if r.str("subject") != a.ns+".VllmWorker.gpu-0" || r.str("lease") != "" || r.str("address") != "10.0.0.5:8000" {
		t.Fatalf("registered: %s", r.Raw)
	}
	created := r.num("create_revision")
	body["data"] = map[string]any{"kv_active_blocks": 900}
	r = a.do("PUT", "/v1/registry/VllmWorker/gpu-0", body).want(t, 200)
	if r.num("create_revision") != created || r.num("mod_revision") <= created {
		t.Fatalf("rewritten: %s", r.Raw)
	}
	a.do("PUT", "/v1/registry/VllmWorker/gpu-0", map[string]any{"session": s2, "address": "x"}).problem(t, 409)
	r = a.do("GET", "/v1/registry/VllmWorker/gpu-0", nil).want(t, 200)
	if d, _ := r.JSON["data"].(map[string]any); d["kv_active_blocks"] != 900.0 {
		t.Fatalf("read: %s", r.Raw)
	}
	a.do("PUT", "/v1/registry/VllmWorker/gpu-1", map[string]any{"session": s2, "address": "10.0.0.6:8000"}).want(t, 201)
	r = a.do("GET", "/v1/registry/VllmWorker", nil).want(t, 200)
	if len(r.List) != 2 {
		t.Fatalf("list: %s", r.Raw)
	}
	a.do("DELETE", "/v1/registry/VllmWorker/gpu-0?session="+s2, nil).problem(t, 404)
	a.do("DELETE", "/v1/registry/VllmWorker/gpu-0?session="+s1, nil).want(t, 204)
	a.do("GET", "/v1/registry/VllmWorker/gpu-0", nil).problem(t, 404)
	a.do("DELETE", "/v1/registry/VllmWorker/gpu-0?session="+s1, nil).problem(t, 404)
	// Ending the session withdraws its endpoints.
	a.do("DELETE", "/v1/sessions/"+s2, nil).want(t, 204)
	if r := a.do("GET", "/v1/registry/VllmWorker", nil).want(t, 200); len(r.List) != 0 {
		t.Fatalf("after the session ended: %s", r.Raw)
	}
}

// TestRegistryBadInput: bad input to the registry routes is a 400 problem
// (413 for an oversize body) and writes nothing.
func TestRegistryBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	sess := a.session(30)
	put := "/v1/registry/model/m1"
	long := strings.Repeat("c", 129)
	bigData := `{"session":"` + sess + `","address":"a","data":{"pad":"` + strings.Repeat("x", 70<<10) + `"}}`
	cases := []badCase{
		{"no address", "PUT", put, map[string]any{"session": sess}, 0},
		{"empty address", "PUT", put, map[string]any{"session": sess, "address": ""}, 0},
		{"address a number", "PUT", put, `{"session":"` + sess + `","address":5}`, 0},
		{"data not an object", "PUT", put, map[string]any{"session": sess, "address": "a", "data": []int{1}}, 0},
		{"data a string", "PUT", put, map[string]any{"session": sess, "address": "a", "data": "x"}, 0},
		{"data over 64 KiB", "PUT", put, bigData, 0},
		{"no session", "PUT", put, map[string]any{"address": "a"}, 0},
		{"bad session", "PUT", put, map[string]any{"session": "not-hex", "address": "a"}, 0},
		{"invalid component", "PUT", "/v1/registry/" + long + "/m1", map[string]any{"session": sess, "address": "a"}, 0},
		{"invalid id", "PUT", "/v1/registry/model/a%20b", map[string]any{"session": sess, "address": "a"}, 0},
		{"deregister without session", "DELETE", put, nil, 0},
		{"deregister invalid id", "DELETE", "/v1/registry/model/a%21?session=" + sess, nil, 0},
		{"list invalid component", "GET", "/v1/registry/a%21", nil, 0},
		{"workers invalid queue", "GET", "/v1/workers?queue=a%21", nil, 0},
		{"watch invalid component", "GET", "/v1/registry/a%21/watch", nil, 0},
	}
	cases = append(cases, badBodies("PUT", put, `{"session":"`+sess+`","address":"a"}`)...)
	checkBad(t, a, cases)
	for _, id := range []string{"x", "-1", "1.5"} {
		if st := a.watch("/v1/registry/model/watch", id); st.Status != 400 {
			t.Errorf("watch with Last-Event-ID %q: %d, want 400", id, st.Status)
		}
	}
}

// TestRegistryEndpointExpires: an endpoint whose session is no longer kept
// alive disappears from a watcher within the TTL + 1 s: the snapshot shows
// none, a put event shows it registered, and a delete event follows.
func TestRegistryEndpointExpires(t *testing.T) {
	a := newAPI(t)
	st := a.watch("/v1/registry/model/watch", "")
	if st.Status != 200 || !strings.HasPrefix(st.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("watch: %d %v", st.Status, st.Header)
	}
	snap := st.next(t, 5*time.Second)
	if snap.Event != "snapshot" || snap.ID == "" || len(snap.Data["endpoints"].([]any)) != 0 {
		t.Fatalf("first event: %+v", snap)
	}
	lastKeepalive := time.Now()
	sess := a.session(2)
	a.do("PUT", "/v1/registry/model/m1", map[string]any{"session": sess, "address": "10.0.0.1:80"}).want(t, 201)
	put := st.next(t, 2*time.Second)
	if put.Event != "put" || put.endpointOf()["id"] != "m1" || put.ID == "" {
		t.Fatalf("after register: %+v", put)
	}
	del := st.next(t, 5*time.Second)
	if del.Event != "delete" || del.endpointOf()["id"] != "m1" || del.endpointOf()["address"] != "10.0.0.1:80" {
		t.Fatalf("after expiry: %+v", del)
	}
	if d := time.Since(lastKeepalive); d > 3*time.Second {
		t.Fatalf("the endpoint went %s after its session's last keepalive; the TTL is 2 s", d)
	}
}

// TestRegistryWatchResume: a watcher that disconnects and reconnects with
// the last event id it saw gets every change made meanwhile exactly once,
// in order, and no snapshot; changes of one revision carry the id on their
// last event only.
func TestRegistryWatchResume(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s1, s2 := a.session(30), a.session(30)
	reg := func(sess, id, addr string) {
		a.do("PUT", "/v1/registry/model/"+id, map[string]any{"session": sess, "address": addr}).want(t, 201)
	}
	reg(s1, "e0", "a0")
	st := a.watch("/v1/registry/model/watch", "")
	snap := st.next(t, 5*time.Second)
	if snap.Event != "snapshot" || len(snap.Data["endpoints"].([]any)) != 1 {
		t.Fatalf("snapshot: %+v", snap)
	}
	reg(s1, "e1", "a1")
	ev := st.next(t, 5*time.Second)
	if ev.Event != "put" || ev.endpointOf()["id"] != "e1" {
		t.Fatalf("event: %+v", ev)
	}
	last := ev.ID
	st.Close()

	// Meanwhile: a new endpoint, a rewrite, a withdrawal, and a session's
	// end that removes two endpoints in one revision.
	reg(s1, "e2", "a2")
	a.do("PUT", "/v1/registry/model/e1", map[string]any{"session": s1, "address": "a1-new"}).want(t, 200)
	a.do("DELETE", "/v1/registry/model/e0?session="+s1, nil).want(t, 204)
	reg(s2, "e3", "a3")
	reg(s2, "e4", "a4")
	a.do("DELETE", "/v1/sessions/"+s2, nil).want(t, 204)
	want := []string{"put e2", "put e1", "delete e0", "put e3", "put e4", "delete e3", "delete e4"}

	re := a.watch("/v1/registry/model/watch", last)
	if re.Status != 200 {
		t.Fatalf("resume: %d", re.Status)
	}
	var got []sseEvent
	for range want {
		got = append(got, re.next(t, 5*time.Second))
	}
	select {
	case ev := <-re.Events:
		t.Fatalf("an event beyond the changes: %+v", ev)
	case <-time.After(300 * time.Millisecond):
	}
	var seq []string
	for i, ev := range got {
		seq = append(seq, ev.Event+" "+ev.endpointOf()["id"].(string))
		rev := int64(ev.Data["revision"].(float64))
		lastOfRev := i == len(got)-1 || int64(got[i+1].Data["revision"].(float64)) != rev
		if lastOfRev != (ev.ID == strconv.FormatInt(rev, 10)) || (!lastOfRev && ev.ID != "") {
			t.Errorf("event %d (%s, revision %d) has id %q; only a revision's last event carries it", i, seq[i], rev, ev.ID)
		}
		if i > 0 && rev < int64(got[i-1].Data["revision"].(float64)) {
			t.Errorf("event %d goes back in revisions", i)
		}
	}
	// The session's end removes e3 and e4 in one revision, in either order.
	slices.Sort(seq[5:])
	if !slices.Equal(seq, want) {
		t.Fatalf("resumed events %v, want %v", seq, want)
	}
	if got[5].Data["revision"] != got[6].Data["revision"] {
		t.Fatalf("the session's end should remove both endpoints at one revision: %v %v", got[5].Data, got[6].Data)
	}
}

// TestRegistryWatchCompacted: resuming after a revision etcd compacted away
// is a 410 problem saying to reconnect without Last-Event-ID.
func TestRegistryWatchCompacted(t *testing.T) {
	_, cli := etcdtest.StartOwn(t)
	a := startAPI(t, httpapi.Config{Etcd: cli, Namespace: "compact", Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	sess := a.session(30)
	st := a.watch("/v1/registry/model/watch", "")
	old := st.next(t, 5*time.Second).ID
	st.Close()
	a.do("PUT", "/v1/registry/model/m1", map[string]any{"session": sess, "address": "a"}).want(t, 201)
	r := a.do("PUT", "/v1/registry/model/m2", map[string]any{"session": sess, "address": "b"}).want(t, 201)
	if _, err := cli.Compact(context.Background(), int64(r.num("mod_revision"))); err != nil {
		t.Fatal(err)
	}
	gone := a.watch("/v1/registry/model/watch", old)
	if gone.Status != 410 {
		t.Fatalf("resume after a compacted revision: %d, want 410", gone.Status)
	}
	a.watch("/v1/registry/model/watch", "").next(t, 5*time.Second) // a fresh snapshot works
}

// TestRegistryWatchEnds: a stream ends when its client goes away and when
// the server closes (Close does not wait for it); the package's leak check
// finds any goroutine left.
func TestRegistryWatchEnds(t *testing.T) {
	a := newAPI(t)
	gone := a.watch("/v1/registry/model/watch", "")
	gone.next(t, 5*time.Second)
	gone.Close()
	st := a.watch("/v1/registry/model/watch", "")
	st.next(t, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := a.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %s with a stream open", d)
	}
	select {
	case _, ok := <-st.Events:
		if ok {
			t.Fatal("an event after Close")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the stream did not end with the server")
	}
}

// TestWorkers: a queue worker's registration (component worker, as drover
// worker writes it) is listed with its load, filtered by queue, and gone
// once the worker's runtime shuts down.
func TestWorkers(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := context.Background()
	rt, err := process.Start(ctx, a.cli, process.WithNamespace(a.ns), process.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(registry.WorkerInfo{Queue: "emails", Concurrency: 4, Prefetch: 4, InFlight: 2, PID: 42, Host: "box", StartedAt: time.Now().UTC()})
	if _, err := registry.Register(ctx, rt, registry.WorkerComponent, registry.Endpoint{ID: "box:42", Address: "box", Data: info}); err != nil {
		t.Fatal(err)
	}
	r := a.do("GET", "/v1/workers", nil).want(t, 200)
	if len(r.List) != 1 {
		t.Fatalf("workers: %s", r.Raw)
	}
	w := r.List[0].(map[string]any)
	if w["id"] != "box:42" || w["queue"] != "emails" || w["in_flight"] != 2.0 || w["concurrency"] != 4.0 || w["lease"] == "" {
		t.Fatalf("worker: %s", r.Raw)
	}
	if r := a.do("GET", "/v1/workers?queue=emails", nil).want(t, 200); len(r.List) != 1 {
		t.Fatalf("workers of emails: %s", r.Raw)
	}
	if r := a.do("GET", "/v1/workers?queue=other", nil).want(t, 200); len(r.List) != 0 {
		t.Fatalf("workers of other: %s", r.Raw)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rt.Shutdown(sctx); err != nil && !errors.Is(err, process.ErrShutdown) {
		t.Fatal(err)
	}
	if r := a.do("GET", "/v1/workers", nil).want(t, 200); len(r.List) != 0 {
		t.Fatalf("workers after shutdown: %s", r.Raw)
	}
}
