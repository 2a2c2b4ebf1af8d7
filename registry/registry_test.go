package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// start starts a runtime in ns that is shut down when the test ends.
func start(t *testing.T, cli *clientv3.Client, ns string, opts ...process.Option) *process.Runtime {
	t.Helper()
	rt, err := process.Start(context.Background(), cli, append([]process.Option{process.WithNamespace(ns), process.WithTTL(2 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = rt.Shutdown(ctx)
	})
	return rt
}

func register(t *testing.T, rt *process.Runtime, component, id, data string) *registry.Registration {
	t.Helper()
	r, err := registry.Register(context.Background(), rt, component, registry.Endpoint{ID: id, Address: "127.0.0.1:9000", Data: json.RawMessage(data)})
	if err != nil {
		t.Fatalf("register %s/%s: %v", component, id, err)
	}
	return r
}

func watch(t *testing.T, cli *clientv3.Client, ns, component string, opts ...registry.WatchOption) *registry.Watcher {
	t.Helper()
	w, err := registry.Watch(context.Background(), cli, ns, component, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

// next returns the watcher's next event, failing after d.
func next(t *testing.T, w *registry.Watcher, d time.Duration) registry.Event {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatal("watcher closed")
		}
		return ev
	case <-time.After(d):
		t.Fatalf("no event within %s", d)
	}
	return registry.Event{}
}

func getKey(t *testing.T, cli *clientv3.Client, key string) *clientv3.GetResponse {
	t.Helper()
	g, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestRegisterUpdateAndDuplicates(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	rt := start(t, cli, ns)
	w := watch(t, cli, ns, "VllmWorker")

	reg := register(t, rt, "VllmWorker", "worker-1", `{"kv_active_blocks": 10, "request_active_slots": 1}`)
	key := keyspace.MustNew(ns).Endpoint("VllmWorker", "worker-1")
	g := getKey(t, cli, key)
	if len(g.Kvs) != 1 || g.Kvs[0].Lease != int64(rt.Lease().ID()) {
		t.Fatalf("endpoint %s not bound to the primary lease: %v", key, g.Kvs)
	}
	var stored map[string]any
	if err := json.Unmarshal(g.Kvs[0].Value, &stored); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`map[address:127.0.0.1:9000 data:map[kv_active_blocks:10 request_active_slots:1] id:worker-1 subject:%s.VllmWorker.worker-1]`, ns)
	if fmt.Sprint(stored) != want {
		t.Fatalf("stored value %v, want %s", stored, want)
	}
	created := g.Kvs[0].CreateRevision
	if ev := next(t, w, 5*time.Second); ev.Type != registry.Put || ev.Instance.ID != "worker-1" || ev.Revision != created {
		t.Fatalf("first event %+v", ev)
	}

	// Registering the same endpoint again from the same runtime is accepted.
	if _, err := registry.Register(ctx, rt, "VllmWorker", registry.Endpoint{ID: "worker-1", Address: "127.0.0.1:9000", Data: json.RawMessage(`{"request_active_slots":1,"kv_active_blocks":10}`)}); err != nil {
		t.Fatalf("registering the same endpoint again: %v", err)
	}

	// Update rewrites data in place: same create revision, same lease, one Put.
	if err := reg.Update(ctx, json.RawMessage(`{"kv_active_blocks": 20}`)); err != nil {
		t.Fatal(err)
	}
	g = getKey(t, cli, key)
	if g.Kvs[0].CreateRevision != created || g.Kvs[0].Lease != int64(rt.Lease().ID()) || g.Kvs[0].Version != 2 {
		t.Fatalf("after update: create rev %d (was %d), lease %x, version %d", g.Kvs[0].CreateRevision, created, g.Kvs[0].Lease, g.Kvs[0].Version)
	}
	ev := next(t, w, 5*time.Second)
	if ev.Type != registry.Put || string(ev.Instance.Data) != `{"kv_active_blocks":20}` || ev.Instance.CreateRevision != created {
		t.Fatalf("update event %+v data %s", ev, ev.Instance.Data)
	}

	// Another live process (runtime) cannot take the id; nothing changes.
	other := start(t, srv.Client(t), ns)
	_, err := registry.Register(ctx, other, "VllmWorker", registry.Endpoint{ID: "worker-1", Address: "127.0.0.1:9001"})
	if !errors.Is(err, registry.ErrDuplicate) || !strings.Contains(err.Error(), "worker-1") {
		t.Fatalf("duplicate id from another process: %v", err)
	}
	if g2 := getKey(t, cli, key); g2.Kvs[0].ModRevision != g.Kvs[0].ModRevision {
		t.Fatal("refused registration changed the key")
	}

	// Shutdown revokes the lease: the endpoint is gone at once, and the id
	// is free for the other process.
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rt.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w, 2*time.Second); ev.Type != registry.Delete || ev.Instance.ID != "worker-1" {
		t.Fatalf("after shutdown: %+v", ev)
	}
	if err := reg.Update(ctx, json.RawMessage(`{}`)); !errors.Is(err, registry.ErrNotRegistered) {
		t.Fatalf("update after shutdown: %v, want ErrNotRegistered", err)
	}
	register(t, other, "VllmWorker", "worker-1", "")
	<-reg.Done()
}

func TestDeregister(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	rt := start(t, cli, ns)
	reg := register(t, rt, "router", "r1", "")
	if err := reg.Deregister(context.Background()); err != nil {
		t.Fatal(err)
	}
	if g := getKey(t, cli, reg.Key()); len(g.Kvs) != 0 {
		t.Fatal("endpoint still registered after Deregister")
	}
	select {
	case <-reg.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("registration did not end after Deregister")
	}
	if err := rt.Err(); err != nil {
		t.Fatalf("runtime stopped by a Deregister: %v", err)
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	rt := start(t, cli, ns)
	ctx := context.Background()
	for _, tc := range []struct {
		name, component, field string
		ep                     registry.Endpoint
	}{
		{"empty component", "", "component", registry.Endpoint{ID: "a", Address: "x"}},
		{"component with slash", "a/b", "component", registry.Endpoint{ID: "a", Address: "x"}},
		{"empty id", "c", "endpoint id", registry.Endpoint{Address: "x"}},
		{"id with space", "c", "endpoint id", registry.Endpoint{ID: "a b", Address: "x"}},
		{"id dot-dot", "c", "endpoint id", registry.Endpoint{ID: "..", Address: "x"}},
		{"no address", "c", "address", registry.Endpoint{ID: "a"}},
		{"data not JSON", "c", "data", registry.Endpoint{ID: "a", Address: "x", Data: json.RawMessage(`{"a":`)}},
		{"data an array", "c", "data", registry.Endpoint{ID: "a", Address: "x", Data: json.RawMessage(`[1,2]`)}},
		{"data too big", "c", "data", registry.Endpoint{ID: "a", Address: "x", Data: json.RawMessage(`{"a":"` + strings.Repeat("x", registry.MaxDataLen) + `"}`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := registry.Register(ctx, rt, tc.component, tc.ep)
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != tc.field {
				t.Fatalf("err %v, want an input error naming %q", err, tc.field)
			}
		})
	}
	for _, ttl := range []time.Duration{0, 500 * time.Millisecond, 48 * time.Hour} {
		if _, err := process.Start(ctx, cli, process.WithNamespace(ns), process.WithTTL(ttl)); !errors.Is(err, drover.ErrInvalidInput) {
			t.Fatalf("TTL %s: %v, want ErrInvalidInput", ttl, err)
		}
	}
	reg := register(t, rt, "c", "a", `{"load":1}`)
	if err := reg.Update(ctx, json.RawMessage(`"not an object"`)); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("update with bad data: %v", err)
	}
	g, err := cli.Get(ctx, "/"+ns+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 1 || string(g.Kvs[0].Key) != reg.Key() || !strings.Contains(string(g.Kvs[0].Value), `"load":1`) {
		t.Fatalf("bad input wrote or changed keys: %v", g.Kvs)
	}
}

// TestKilledProcessDisappearsFromEveryWatcher kills a registered process
// with SIGKILL: each of three watchers must see its Delete within TTL + 1 s.
func TestKilledProcessDisappearsFromEveryWatcher(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	const ttl = 2 * time.Second
	var watchers []*registry.Watcher
	for range 3 {
		watchers = append(watchers, watch(t, srv.Client(t), ns, ""))
	}
	cmd := startRegistered(t, ns, "model", "m1")
	for _, w := range watchers {
		if ev := next(t, w, 5*time.Second); ev.Type != registry.Put || ev.Instance.ID != "m1" {
			t.Fatalf("registration event %+v", ev)
		}
	}
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i, w := range watchers {
		ev := next(t, w, ttl+2*time.Second)
		took := time.Since(killed)
		if ev.Type != registry.Delete || ev.Instance.ID != "m1" {
			t.Fatalf("watcher %d: %+v, want the Delete of m1", i, ev)
		}
		if took > ttl+time.Second {
			t.Fatalf("watcher %d saw the Delete %s after SIGKILL; want within TTL + 1 s", i, took)
		}
		t.Logf("watcher %d saw the Delete %s after SIGKILL", i, took.Round(time.Millisecond))
	}
	if g := getKey(t, cli, keyspace.MustNew(ns).Endpoint("model", "m1")); len(g.Kvs) != 0 {
		t.Fatal("endpoint still in etcd")
	}
}
