package httpapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
	"github.com/prometheus/client_golang/prometheus"
)

// Servers finish the cancel cascades left in their namespace, of any
// queue, with no worker in process: two servers serving one namespace
// both scan; a mark nobody holds is worked on and removed (its task is
// gone: nothing to cancel), and a mark another scanner claimed, whose
// claim holds, is left to it.
func TestServersFinishCascadesLeft(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	startAPI(t, httpapi.Config{Etcd: a.cli, Namespace: a.ns, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		MaxWait: 10 * time.Second, RequestTimeout: time.Minute})
	keys := keyspace.MustNew(a.ns)
	ctx := context.Background()
	free, held := keys.ChildCascade("httponly", "gone-1"), keys.ChildCascade("other", "gone-2")
	b, _ := json.Marshal(map[string]any{"worker": "another", "until": time.Now().Add(time.Hour)})
	if _, err := a.cli.Put(ctx, free, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := a.cli.Put(ctx, held, string(b)); err != nil {
		t.Fatal(err)
	}
	waitMarkGone(t, a, free)
	g, err := a.cli.Get(ctx, held)
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != string(b) {
		t.Fatalf("the mark another scanner holds: %v (%v); want it left as it was", g.Kvs, err)
	}
}

// waitMarkGone waits until the cascade mark key is gone.
func waitMarkGone(t *testing.T, a *api, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // the first scan comes within 3 s of its start
	for {
		g, err := a.cli.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Kvs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cascade mark %s is still there: no server finished it", key)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A server finishes the cascades of every namespace it serves queue
// requests of, not only of its --namespace: a namespace whose HTTP workers
// come back after a restart has its left cascades finished.
func TestServerFinishesCascadesOfNamespacesItServes(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	other := a.ns + "-other"
	mark := keyspace.MustNew(other).ChildCascade("httponly", "gone-1")
	if _, err := a.cli.Put(context.Background(), mark, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = a.cli.Delete(context.Background(), mark) })
	// Nothing scans the other namespace yet: the mark stays past a scan
	// of the server's own (every 3 s at first).
	time.Sleep(4 * time.Second)
	if g, err := a.cli.Get(context.Background(), mark); err != nil || len(g.Kvs) != 1 {
		t.Fatalf("the mark of a namespace no request named: %v (%v); want it left until one does", g, err)
	}
	if r := a.do("GET", "/v1/queues/httponly/stats", nil, httpapi.NamespaceHeader+": "+other); r.Status != 200 && r.Status != 404 {
		t.Fatalf("stats in %s: %d %s", other, r.Status, r.Raw)
	}
	waitMarkGone(t, a, mark)
}
