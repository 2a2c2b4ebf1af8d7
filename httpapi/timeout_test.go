package httpapi_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/httpapi"
	"github.com/prometheus/client_golang/prometheus"
)

// stallProxy forwards TCP connections to an etcd until stall: then it
// holds every byte, as a paused (SIGSTOPped) etcd or a cluster without
// quorum does; connections stay open and nothing answers.
type stallProxy struct {
	l  net.Listener
	up string

	mu    sync.Mutex
	gate  chan struct{} // closed while bytes flow
	conns []net.Conn
	wg    sync.WaitGroup
}

func newStallProxy(t *testing.T, upstream string) *stallProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{l: l, up: upstream, gate: make(chan struct{})}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.l.Addr().String() }

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.up)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(u, c)
		go p.pipe(c, u)
	}
}

// pipe copies src to dst, holding each read until the gate is open.
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			<-gate
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// stall stops forwarding; resume forwards again.
func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = make(chan struct{})
}

func (p *stallProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

func (p *stallProxy) close() {
	p.resume()
	_ = p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// answerWithin sends req with a client that has no timeout of its own and
// returns the answer; the test fails if none comes within guard (a bound
// against hanging only, far above the server's).
func answerWithin(t *testing.T, req *http.Request, guard time.Duration) (*http.Response, []byte) {
	t.Helper()
	type answer struct {
		r   *http.Response
		raw []byte
		err error
	}
	hc := &http.Client{Transport: &http.Transport{}} // no timeout: the server must answer
	defer hc.CloseIdleConnections()
	done := make(chan answer, 1)
	go func() {
		r, err := hc.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer r.Body.Close()
		raw, err := io.ReadAll(r.Body)
		done <- answer{r, raw, err}
	}()
	select {
	case a := <-done:
		if a.err != nil {
			t.Fatalf("%s %s: %v", req.Method, req.URL.Path, a.err)
		}
		return a.r, a.raw
	case <-time.After(guard):
		t.Fatalf("%s %s: no answer within %s", req.Method, req.URL.Path, guard)
		return nil, nil
	}
}

// TestStalledEtcdAnswers503: with the etcd behind the server no longer
// answering, every route answers 503 with Retry-After within the server's
// request timeout, to a client that would wait forever; long polls and
// bulk routes as soon as a probe finds etcd stalled, long before their
// longer bounds; and a stream before it starts.
func TestStalledEtcdAnswers503(t *testing.T) {
	t.Parallel()
	p := newStallProxy(t, srv.Endpoints()[0])
	cli, err := cluster.Connect(context.Background(), cluster.ClientConfig{Endpoints: []string{p.addr()}, DialTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	a := newAPI(t, func(c *httpapi.Config) {
		c.Etcd = cli
		c.RequestTimeout = 200 * time.Millisecond
		c.MaxWait = 2 * time.Minute // past the guard: a stalled long poll must end sooner
	})
	// The client's connection goes through the proxy before it stalls.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "/"+a.ns+"/"); err != nil {
		t.Fatal(err)
	}
	p.stall()
	defer p.resume() // before the server closes
	for _, c := range []struct{ method, path, body, accept string }{
		{"POST", "/v1/sessions", `{"ttl": 10}`, ""},
		{"GET", "/v1/queues", "", ""},
		{"POST", "/v1/locks/stalled", `{"owner": "w1", "ttl": 5}`, ""},
		{"POST", "/v1/queues/q/tasks", `[{"task_id": "t1", "task_type": "x"}]`, ""},
		{"POST", "/v1/queues/q/claim", `{"session": "1a2b.c3d4c3d4c3d4c3d4c3d4", "wait": "100s"}`, ""},
		{"GET", "/v1/events", "", "text/event-stream"},
	} {
		req, err := http.NewRequest(c.method, a.base+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(httpapi.NamespaceHeader, a.ns)
		if c.accept != "" {
			req.Header.Set("Accept", c.accept)
		}
		r, raw := answerWithin(t, req, time.Minute)
		if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" ||
			r.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(raw), "problems/unavailable") {
			t.Fatalf("%s %s: %d Retry-After %q %s; want a 503 problem with Retry-After", c.method, c.path, r.StatusCode, r.Header.Get("Retry-After"), raw)
		}
		t.Logf("%s %s: %d %s", c.method, c.path, r.StatusCode, raw)
	}
}

// TestLongPollsAndStreamsOutliveRequestTimeout: a lock wait longer than
// the request timeout gets its answer, not a 503, and an event stream
// still delivers events after it.
func TestLongPollsAndStreamsOutliveRequestTimeout(t *testing.T) {
	t.Parallel()
	const bound = time.Second
	a := newAPI(t, func(c *httpapi.Config) { c.RequestTimeout = bound })
	// A second server on the same namespace, with the default bound, does
	// the setup, so that a loaded machine cannot fail it.
	b := newAPI(t, func(c *httpapi.Config) { c.Namespace = a.ns })
	sid := b.session(30)
	b.do("POST", "/v1/locks/busy", map[string]any{"session": sid}).want(t, 200)
	other := b.session(30)
	start := time.Now()
	r := a.do("POST", "/v1/locks/busy?wait=2s", map[string]any{"session": other})
	if r.Status == http.StatusServiceUnavailable {
		t.Fatalf("a lock wait of 2s under a request timeout of %s: %s", bound, r.Raw)
	}
	if time.Since(start) < 2*time.Second {
		t.Fatalf("the lock wait answered %d after %s, before its wait", r.Status, time.Since(start))
	}

	req, err := http.NewRequest("GET", a.base+"/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(httpapi.NamespaceHeader, a.ns)
	req.Header.Set("Accept", "text/event-stream")
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	sr, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Body.Close()
	events := make(chan string, 16)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(sr.Body)
		for sc.Scan() {
			if name, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
				events <- name
			}
		}
	}()
	if e := <-events; e != "snapshot" {
		t.Fatalf("first event %q, want snapshot", e)
	}
	time.Sleep(2 * bound) // past the request timeout: the stream must live on
	b.do("POST", "/v1/queues/q/tasks", qtasksJSON("t", 1)).want(t, 200)
	guard := time.After(time.Minute)
	for {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("the stream ended at the request timeout")
			}
			if e == "queues" {
				return
			}
		case <-guard:
			t.Fatal("no queues event within a minute of a submission")
		}
	}
}

// TestBulkRoutesExist: every route named as a bulk route (given more time
// than the request timeout) is one of the API's.
func TestBulkRoutesExist(t *testing.T) {
	t.Parallel()
	s, err := httpapi.New(httpapi.Config{Etcd: srv.LocalClient(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	ids := map[string]bool{}
	for _, item := range s.API().OpenAPI().Paths {
		for _, op := range []*huma.Operation{item.Get, item.Post, item.Put, item.Patch, item.Delete} {
			if op != nil {
				ids[op.OperationID] = true
			}
		}
	}
	for id := range httpapi.BulkRoutes {
		if !ids[id] {
			t.Errorf("bulk route %q is no operation of the API", id)
		}
	}
	// The list of every checkpoint costs in proportion to the threads.
	if !httpapi.BulkRoutes["list-all-checkpoints"] {
		t.Error("list-all-checkpoints is no bulk route")
	}
}

// TestBulkBodiesGetBulkReadTime: a route that takes a body over the
// default limit and has huma read it lets the body take as long to arrive
// as the route's bound (huma's default is 5 s).
func TestBulkBodiesGetBulkReadTime(t *testing.T) {
	t.Parallel()
	s, err := httpapi.New(httpapi.Config{Etcd: srv.LocalClient(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	n := 0
	for _, item := range s.API().OpenAPI().Paths {
		for _, op := range []*huma.Operation{item.Post, item.Put, item.Patch} {
			if op == nil || op.MaxBodyBytes <= httpapi.DefaultMaxBodyBytes || op.BodyReadTimeout == 0 {
				continue // no body huma reads, or a small one
			}
			n++
			if op.BodyReadTimeout > 0 && op.BodyReadTimeout < httpapi.BulkAllowance {
				t.Errorf("%s: its body may take %s to arrive, its bound gives %s", op.OperationID, op.BodyReadTimeout, httpapi.BulkAllowance)
			}
		}
	}
	if n < 4 { // checkpoints, their writes, steps, completions
		t.Fatalf("%d routes take large bodies that huma reads, want 4 or more", n)
	}
}
