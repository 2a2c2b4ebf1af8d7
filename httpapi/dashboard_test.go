package httpapi_test

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestDashboardQueues: GET /v1/queues lists every queue with its counts by
// status and its settings (max depth, FIFO).
func TestDashboardQueues(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/alpha/tasks", qtasksJSON("a", 3)).want(t, 200)
	a.do("POST", "/v1/queues/beta/tasks", qtasksJSON("b", 2)).want(t, 200)
	c, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(context.Background(), "beta", queue.Config{MaxDepth: 50, FIFO: true}); err != nil {
		t.Fatal(err)
	}
	sess := a.session(30)
	task := a.qclaim("beta", sess, 1, "")[0]
	a.do("POST", qtaskPath("beta", task, "fail"), qfence(sess, task, "error", "boom", "permanent", true)).want(t, 200)

	var qs []httpapi.QueueSummary
	if err := json.Unmarshal(a.do("GET", "/v1/queues", nil).want(t, 200).Raw, &qs); err != nil {
		t.Fatal(err)
	}
	want := []httpapi.QueueSummary{
		{Name: "alpha", Pending: 3},
		{Name: "beta", Pending: 1, Dead: 1, MaxDepth: 50, FIFO: true},
	}
	if len(qs) != len(want) || qs[0] != want[0] || qs[1] != want[1] {
		t.Fatalf("queues: %+v, want %+v", qs, want)
	}
}

// TestDashboardWhoami: without auth every request may do everything; with
// auth, whoami names the token, its role and namespaces, and no token is a
// 401 (what the dashboard's login waits for).
func TestDashboardWhoami(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	r := a.do("GET", "/v1/whoami", nil).want(t, 200)
	if r.JSON["auth"] != false || r.str("role") != "admin" || r.str("namespace") != a.ns || r.JSON["allowed"] != true || r.str("default_namespace") != a.ns {
		t.Fatalf("whoami without auth: %s", r.Raw)
	}
	b := authAPI(t)
	b.do("GET", "/v1/whoami", nil).problem(t, 401)
	b.token = readTok
	r = b.do("GET", "/v1/whoami", nil).want(t, 200)
	if r.JSON["auth"] != true || r.str("role") != "read" || r.str("name") != "reader" || r.str("namespace") != b.ns {
		t.Fatalf("whoami of the read token: %s", r.Raw)
	}
	if ns, _ := r.JSON["namespaces"].([]any); len(ns) != 1 || ns[0] != b.ns {
		t.Fatalf("namespaces: %s", r.Raw)
	}
	b.token = adminTok
	if r = b.do("GET", "/v1/whoami", nil).want(t, 200); r.str("role") != "admin" {
		t.Fatalf("whoami of the admin token: %s", r.Raw)
	}
	b.token = "" // LangGraph's clients send their token as X-Api-Key
	r = b.do("GET", "/v1/whoami", nil, "X-Api-Key: "+readTok).want(t, 200)
	if r.JSON["auth"] != true || r.str("role") != "read" || r.str("name") != "reader" || r.JSON["allowed"] != true {
		t.Fatalf("whoami of the read token as X-Api-Key: %s", r.Raw)
	}
}

// TestDashboardWhoamiScopedToken: whoami answers a token limited to other
// namespaces whatever namespace the request names, saying whether the token
// may use it and which it may use; every other route still answers 403
// there, and whoami still wants a valid token.
func TestDashboardWhoamiScopedToken(t *testing.T) {
	t.Parallel()
	const agentsTok = "agents-token-0123456789"
	a := newAPI(t, func(c *httpapi.Config) {
		auth, err := httpapi.NewAuth([]httpapi.AuthEntry{{Name: "agents", Token: agentsTok, Namespaces: []string{"team-a", "team-b"}, Role: "write"}})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	a.token = agentsTok
	for _, tc := range []struct {
		ns      string
		allowed bool
	}{{a.ns, false}, {"team-a", true}, {"team-b", true}, {"team-c", false}} {
		r := a.do("GET", "/v1/whoami", nil, httpapi.NamespaceHeader+": "+tc.ns).want(t, 200)
		var me httpapi.Whoami
		if err := json.Unmarshal(r.Raw, &me); err != nil {
			t.Fatal(err)
		}
		want := httpapi.Whoami{Auth: true, Name: "agents", Role: "write", Namespace: tc.ns, Allowed: tc.allowed, Default: a.ns,
			Namespaces: []string{"team-a", "team-b"}}
		if !reflect.DeepEqual(me, want) {
			t.Errorf("whoami in %s: %+v, want %+v", tc.ns, me, want)
		}
	}
	a.do("GET", "/v1/queues", nil).problem(t, 403)
	a.do("GET", "/v1/whoami", nil, httpapi.NamespaceHeader+": not a namespace").problem(t, 400)
	a.token = "not-a-token-of-this-server"
	a.do("GET", "/v1/whoami", nil, httpapi.NamespaceHeader+": team-a").problem(t, 401)
	a.token = ""
	a.do("GET", "/v1/whoami", nil, httpapi.NamespaceHeader+": team-a").problem(t, 401)
}

// TestDashboardComponents: GET /v1/registry lists every component with its
// live endpoints, by name.
func TestDashboardComponents(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	sess := a.session(30)
	a.do("PUT", "/v1/registry/gw/g1", map[string]any{"session": sess, "address": "127.0.0.1:9001", "data": map[string]any{"load": 3}}).want(t, 201)
	a.do("PUT", "/v1/registry/gw/g2", map[string]any{"session": sess, "address": "127.0.0.1:9002"}).want(t, 201)
	a.do("PUT", "/v1/registry/cache/c1", map[string]any{"session": sess, "address": "127.0.0.1:9100"}).want(t, 201)
	var cs []httpapi.ComponentBody
	if err := json.Unmarshal(a.do("GET", "/v1/registry", nil).want(t, 200).Raw, &cs); err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].Component != "cache" || len(cs[0].Endpoints) != 1 || cs[1].Component != "gw" || len(cs[1].Endpoints) != 2 {
		t.Fatalf("components: %+v", cs)
	}
	if string(cs[1].Endpoints[0].Data) != `{"load":3}` {
		t.Fatalf("data: %s", cs[1].Endpoints[0].Data)
	}
}

// TestDashboardLockWaiters: a lock's line lists the holder and the
// contenders waiting in order, by their holder records, with the token each
// will get; never a contender key.
func TestDashboardLockWaiters(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	holder, waiter := a.session(30), a.session(30)
	r := a.do("POST", "/v1/locks/report", map[string]any{"session": holder}).want(t, 200)
	tok, contender := int64(r.num("token")), r.str("contender")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.do("POST", "/v1/locks/report?wait=5s", map[string]any{"session": waiter})
	}()
	var line httpapi.LockLine
	ok := etcdtest.Eventually(5*time.Second, func() bool {
		raw := a.do("GET", "/v1/locks/report/waiters", nil).want(t, 200).Raw
		if strings.Contains(string(raw), contender) {
			t.Fatalf("the line shows a contender key: %s", raw)
		}
		_ = json.Unmarshal(raw, &line)
		return line.Total == 1
	})
	if !ok || line.Holder == nil || line.Holder.Token != tok || line.Holder.Position != 0 ||
		len(line.Waiters) != 1 || line.Waiters[0].Position != 1 || line.Waiters[0].Token <= tok || line.Waiters[0].Holder.ID == "" {
		t.Fatalf("line: %+v", line)
	}
	a.do("DELETE", "/v1/locks/report?token="+strconv.FormatInt(tok, 10)+"&contender="+contender+"&session="+holder, nil).want(t, 204)
	wg.Wait()
	if r := a.do("GET", "/v1/locks/free/waiters", nil).want(t, 200); r.JSON["holder"] != nil || r.num("total_waiters") != 0 {
		t.Fatalf("a free lock's line: %s", r.Raw)
	}
	a.do("GET", "/v1/locks/bad%20name/waiters", nil).problem(t, 400)
}

// TestDashboardPaxos: a server without a group says so; with one it names
// the leader with the highest ballot and each node's lag as the leader sees
// it, and a node that does not answer with its error.
func TestDashboardPaxos(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	if r := a.do("GET", "/v1/paxos", nil).want(t, 200); r.JSON["configured"] != false || r.str("detail") == "" {
		t.Fatalf("no group: %s", r.Raw)
	}
	leader := fakePaxosNode(t, `{"id":1,"role":"leader","leader":1,"has_leader":true,"leader_addr":"127.0.0.1:7101","ballot":{"r":4,"n":1},`+
		`"commit":90,"applied":90,"members":[{"id":1,"match":90,"lag":0},{"id":2,"match":85,"lag":5}]}`)
	follower := fakePaxosNode(t, `{"id":2,"role":"follower","leader":1,"has_leader":true,"ballot":{"r":4,"n":1},"commit":85,"applied":85}`)
	down := etcdtest.FreeAddr()
	b := newAPI(t, func(c *httpapi.Config) { c.PaxosEndpoints = []string{leader, follower, down} })
	var g httpapi.PaxosGroup
	if err := json.Unmarshal(b.do("GET", "/v1/paxos", nil).want(t, 200).Raw, &g); err != nil {
		t.Fatal(err)
	}
	if !g.Configured || !g.HasLeader || g.Leader == nil || *g.Leader != 1 || g.Ballot != "4.1" || g.Commit != 90 || len(g.Nodes) != 3 {
		t.Fatalf("group: %+v", g)
	}
	if n := g.Nodes[1]; n.Lag == nil || *n.Lag != 5 || n.Role != "follower" {
		t.Fatalf("follower: %+v", n)
	}
	if n := g.Nodes[2]; n.Error == "" || n.ID != nil {
		t.Fatalf("a node that is down: %+v", n)
	}
	if _, err := httpapi.New(httpapi.Config{Etcd: b.cli, PaxosEndpoints: []string{"not an endpoint"}}); err == nil {
		t.Fatal("a bad Paxos endpoint was accepted")
	}
}

// fakePaxosNode serves status as a Paxos node's GET /status on a loopback
// port and returns its address.
func fakePaxosNode(t *testing.T, status string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(status))
	}), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// TestDashboardHistory: the server samples its namespace's counts: tasks
// that succeed show as processed per second, tasks that die as failed per
// second, with the counts of the last sample.
func TestDashboardHistory(t *testing.T) {
	a := newAPI(t, func(c *httpapi.Config) { c.StatsInterval = 100 * time.Millisecond })
	a.do("POST", "/v1/queues/h/tasks", qtasksJSON("h", 4)).want(t, 200)
	// A first sample before anything is done, so that the work shows as a rate.
	etcdtest.Eventually(5*time.Second, func() bool { return len(a.history().Samples) > 0 })
	sess := a.session(30)
	for i, task := range a.qclaim("h", sess, 4, "") {
		if i < 3 {
			a.do("POST", qtaskPath("h", task, "ack"), qfence(sess, task)).want(t, 200)
		} else {
			a.do("POST", qtaskPath("h", task, "fail"), qfence(sess, task, "error", "boom", "permanent", true)).want(t, 200)
		}
	}
	var h httpapi.StatsHistory
	ok := etcdtest.Eventually(5*time.Second, func() bool {
		h = a.history()
		last := h.Samples[len(h.Samples)-1]
		return last.Succeeded == 3 && last.Dead == 1
	})
	if !ok || h.Namespace != a.ns || h.Interval != 0.1 || h.Window != 3600 || !h.Following {
		t.Fatalf("history: %+v", h)
	}
	var processed, failed float64 // each rate times the time since the sample before
	for i := 1; i < len(h.Samples); i++ {
		dt := h.Samples[i].At.Sub(h.Samples[i-1].At).Seconds()
		processed += h.Samples[i].Processed * dt
		failed += h.Samples[i].Failed * dt
	}
	if math.Abs(processed-3) > 0.01 || math.Abs(failed-1) > 0.01 {
		t.Fatalf("processed %.2f and failed %.2f over the samples, want about 3 and 1: %+v", processed, failed, h.Samples)
	}
}

func (a *api) history() httpapi.StatsHistory {
	a.t.Helper()
	var h httpapi.StatsHistory
	if err := json.Unmarshal(a.do("GET", "/v1/stats/history", nil).want(a.t, 200).Raw, &h); err != nil {
		a.t.Fatal(err)
	}
	return h
}

// TestDashboardEvents: GET /v1/events sends a snapshot of the queues, then
// the counts again when a task is submitted, and names the locks when one
// is taken; without text/event-stream the answer is the snapshot as JSON.
func TestDashboardEvents(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/ev/tasks", qtasksJSON("e", 1)).want(t, 200)
	r := a.do("GET", "/v1/events", nil, "Accept: application/json").want(t, 200)
	if qs, _ := r.JSON["queues"].([]any); r.str("namespace") != a.ns || len(qs) != 1 {
		t.Fatalf("snapshot as JSON: %s", r.Raw)
	}
	st := a.watch("/v1/events", "")
	if ev := st.next(t, 5*time.Second); ev.Event != "snapshot" || pendingOf(ev, "ev") != 1 {
		t.Fatalf("first event: %+v", ev)
	}
	a.do("POST", "/v1/queues/ev/tasks", qtasksJSON("f", 2)).want(t, 200)
	waitEvent(t, st, func(ev sseEvent) bool { return ev.Event == "queues" && pendingOf(ev, "ev") == 3 })
	sess := a.session(30)
	a.do("POST", "/v1/locks/l", map[string]any{"session": sess}).want(t, 200)
	waitEvent(t, st, func(ev sseEvent) bool {
		topics, _ := ev.Data["topics"].([]any)
		return ev.Event == "changed" && len(topics) > 0 && topics[0] == "locks"
	})
}

// waitEvent reads events until match accepts one, failing after 10 s.
func waitEvent(t *testing.T, st *sseStream, match func(sseEvent) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if match(st.next(t, time.Until(deadline))) {
			return
		}
	}
	t.Fatal("no matching event within 10 s")
}

// pendingOf is queue q's pending count in a snapshot or queues event.
func pendingOf(ev sseEvent, q string) float64 {
	qs, _ := ev.Data["queues"].([]any)
	for _, x := range qs {
		if m, _ := x.(map[string]any); m["name"] == q {
			n, _ := m["pending"].(float64)
			return n
		}
	}
	return -1
}

// TestDashboardServed: the dashboard is served at /ui/ with a strict
// content security policy, / and /ui redirect to it, its scripts load, and
// a missing file is a 404.
func TestDashboardServed(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 10 * time.Second}
	for _, p := range []string{"/", "/ui"} {
		r, err := hc.Get(a.base + p)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusFound || r.Header.Get("Location") != "/ui/" {
			t.Fatalf("GET %s: %d to %q", p, r.StatusCode, r.Header.Get("Location"))
		}
	}
	r := a.do("GET", "/ui/", nil).want(t, 200)
	if !strings.Contains(string(r.Raw), `<script type="module" src="js/app.js">`) || !strings.Contains(r.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("index: %s %v", r.Raw, r.Header)
	}
	if r = a.do("GET", "/ui/js/app.js", nil).want(t, 200); !strings.HasPrefix(r.Header.Get("Content-Type"), "text/javascript") {
		t.Fatalf("app.js: %v", r.Header)
	}
	a.do("GET", "/ui/js/nothing.js", nil).want(t, 404)
	a.do("GET", "/ui/js/app.js", nil, "If-None-Match: "+r.Header.Get("ETag")).want(t, 304)
}
