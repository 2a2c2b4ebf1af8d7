package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// apiServer is a drover server in front of the test etcd, serving the HTTP
// API and metrics, in namespace ns.
type apiServer struct {
	t         *testing.T
	ns        string
	http, met string // host:port of the HTTP API and of /metrics
}

func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	s := &apiServer{t: t, ns: etcdtest.Namespace(t), http: "127.0.0.1:" + port(t), met: "127.0.0.1:" + port(t)}
	p := start(t, cleanEnv(), append(etcdFlags(s.ns), "server", "--http-listen", s.http, "--metrics-listen", s.met)...)
	waitFor(t, 30*time.Second, "the server ready", func() bool { return strings.Contains(p.stderr.String(), "HTTP API ready") })
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Errorf("server exit %d:\n%s", code, p.stderr.String())
		}
	})
	return s
}

// call sends a JSON body to the HTTP API and decodes the answer.
func (s *apiServer) call(method, path string, body any, want int) map[string]any {
	s.t.Helper()
	raw, _ := json.Marshal(body)
	req, err := http.NewRequest(method, "http://"+s.http+path, bytes.NewReader(raw))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Drover-Namespace", s.ns)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != want {
		s.t.Fatalf("%s %s: %d %s, want %d", method, path, r.StatusCode, b, want)
	}
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// TestTaskHistoryOfHTTPClaim: a task claimed over HTTP with "steps": 3 and
// checkpointed without repeating the count reads, in drover task history,
// as at step 2 of 3.
func TestTaskHistoryOfHTTPClaim(t *testing.T) {
	s := startAPIServer(t)
	sess := s.call("POST", "/v1/sessions", map[string]any{"ttl": 30, "name": "agent-1"}, 201)["id"]
	tok := s.call("POST", "/v1/agent-tasks/report-42/claim", map[string]any{"session": sess, "steps": 3}, 200)["token"]
	for n := 1; n <= 2; n++ {
		s.call("PUT", fmt.Sprintf("/v1/agent-tasks/report-42/steps/%d", n), map[string]any{"session": sess, "token": tok, "state": "eA=="}, 200)
	}
	r := drover(t, append(etcdFlags(s.ns), "task", "history", "report-42")...)
	if r.code != 0 || !strings.Contains(r.stdout, "at step 2 of 3") {
		t.Fatalf("task history: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if h := taskHistory(t, etcdFlags(s.ns), "report-42"); h.Steps != 3 || h.Step != 2 || len(h.History) != 2 {
		t.Fatalf("task history --json: %+v", h)
	}
}

// TestServerMetricsQueueDepth: the server's /metrics has drover_queue_tasks
// for the queues of its namespace, by state (scheduled, sleeping and waiting too), without a
// worker counting.
func TestServerMetricsQueueDepth(t *testing.T) {
	s := startAPIServer(t)
	q := "depth" // the server is a process of its own: its gauges are its namespace's
	tasks := []map[string]any{}
	for i := range 4 {
		tasks = append(tasks, map[string]any{"task_id": fmt.Sprintf("d%d", i), "task_type": "x"})
	}
	tasks = append(tasks, map[string]any{"task_id": "later", "task_type": "x", "delay": "1h"})
	s.call("POST", "/v1/queues/"+q+"/tasks", tasks, 200)
	sess := s.call("POST", "/v1/sessions", map[string]any{"ttl": 30}, 201)["id"]
	claimed := s.call("POST", "/v1/queues/"+q+"/claim", map[string]any{"session": sess, "max": 2}, 200)["tasks"].([]any)
	if len(claimed) != 2 {
		t.Fatalf("claimed %d tasks, want 2", len(claimed))
	}
	parked := claimed[1].(map[string]any) // sleeps: the gauge counts it apart
	s.call("POST", "/v1/queues/"+q+"/outcomes", map[string]any{"session": sess,
		"outcomes": []map[string]any{{"task_id": parked["task_id"], "token": parked["token"], "sleep_for": "1h"}}}, 200)
	pending := regexp.MustCompile(`drover_queue_tasks\{queue="` + regexp.QuoteMeta(q) + `",state="pending"\} 2\b`)
	running := regexp.MustCompile(`drover_queue_tasks\{queue="` + regexp.QuoteMeta(q) + `",state="running"\} 1\b`)
	scheduled := regexp.MustCompile(`drover_queue_tasks\{queue="` + regexp.QuoteMeta(q) + `",state="scheduled"\} 1\b`)
	sleeping := regexp.MustCompile(`drover_queue_tasks\{queue="` + regexp.QuoteMeta(q) + `",state="sleeping"\} 1\b`)
	waiting := regexp.MustCompile(`drover_queue_tasks\{queue="` + regexp.QuoteMeta(q) + `",state="waiting"\} 0\b`)
	// The server counts every 5 s: the bound only guards against a hang.
	waitFor(t, 60*time.Second, "drover_queue_tasks 1 scheduled, 2 pending, 1 running, 1 sleeping in the server's /metrics", func() bool {
		time.Sleep(100 * time.Millisecond)
		r, err := http.Get("http://" + s.met + "/metrics")
		if err != nil {
			return false
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return pending.MatchString(string(b)) && running.MatchString(string(b)) && scheduled.MatchString(string(b)) && sleeping.MatchString(string(b)) && waiting.MatchString(string(b))
	})
}
