package httpapi_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/storeguard"
	"github.com/prometheus/client_golang/prometheus"
)

// TestQueueSubmitFullAnswers: a queue at its maximum depth answers 429
// with Retry-After (the tasks that fitted are stored, the rest not); a
// store past its high-water mark answers 507 with Retry-After and stores
// nothing, while a lock is still granted; /readyz says store_full and
// stays ready.
func TestQueueSubmitFullAnswers(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	c, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(context.Background(), "capped", queue.Config{MaxDepth: 3}); err != nil {
		t.Fatal(err)
	}
	tasks := func(prefix string, n int) []map[string]any {
		out := make([]map[string]any, n)
		for i := range out {
			out[i] = map[string]any{"task_id": fmt.Sprintf("%s-%d", prefix, i), "task_type": "x"}
		}
		return out
	}
	r := a.do("POST", "/v1/queues/capped/tasks", tasks("a", 5)).problem(t, 429)
	if r.Header.Get("Retry-After") == "" || !strings.Contains(r.str("detail"), "max-depth") {
		t.Fatalf("429 without Retry-After or advice: %v %s", r.Header, r.Raw)
	}
	st := a.do("GET", "/v1/queues/capped/stats", nil).want(t, 200)
	if !strings.Contains(string(st.Raw), `"PENDING":3`) && !strings.Contains(string(st.Raw), `"pending":3`) {
		t.Fatalf("after a 429 the queue should hold the 3 that fitted: %s", st.Raw)
	}

	if err := storeguard.Set(context.Background(), a.cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.7, LowWater: 0.6, Since: time.Now()}, keyspace.MustNew(a.ns)); err != nil {
		t.Fatal(err)
	}
	before := a.keyCount()
	r = a.do("POST", "/v1/queues/open/tasks", tasks("b", 2)).problem(t, 507)
	if r.Header.Get("Retry-After") == "" || !strings.Contains(r.str("detail"), "quota") {
		t.Fatalf("507 without Retry-After or usage: %v %s", r.Header, r.Raw)
	}
	if n := a.keyCount(); n != before {
		t.Fatalf("%d keys before a refused submission, %d after", before, n)
	}
	sid := a.session(10)
	a.do("POST", "/v1/locks/still-works", map[string]any{"session": sid}).want(t, 200)
	ready := a.do("GET", "/readyz", nil).want(t, 200)
	if ready.JSON["store_full"] != true {
		t.Fatalf("/readyz on a full store: %s", ready.Raw)
	}
}

// TestReadyzWhenEtcdIsDown: /readyz answers 503 with the reason once etcd
// stops answering; /healthz still answers 200.
func TestReadyzWhenEtcdIsDown(t *testing.T) {
	t.Parallel()
	own, cli := etcdtest.StartOwn(t)
	a := startAPI(t, httpapi.Config{Etcd: cli, Namespace: etcdtest.Namespace(t), Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	a.do("GET", "/readyz", nil).want(t, 200)
	own.Stop()
	r := a.do("GET", "/readyz", nil).problem(t, 503)
	if !strings.Contains(r.str("detail"), "etcd") {
		t.Fatalf("503 without the reason: %s", r.Raw)
	}
	a.do("GET", "/healthz", nil).want(t, 200)
}
