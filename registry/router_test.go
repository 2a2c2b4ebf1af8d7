package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func router(t *testing.T, cli *clientv3.Client, ns, component string, p registry.Policy) *registry.Router {
	t.Helper()
	w := watch(t, cli, ns, component)
	r := registry.NewRouter(w, p)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// caughtUp waits until r has applied every change etcd holds.
func caughtUp(t *testing.T, cli *clientv3.Client, r *registry.Router, ns string) {
	t.Helper()
	g, err := cli.Get(context.Background(), "/"+ns+"/components/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	for _, kv := range g.Kvs {
		last = max(last, kv.ModRevision)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.WaitRevision(ctx, last); err != nil {
		t.Fatalf("router did not reach revision %d: %v", last, err)
	}
}

func TestRouterLeastLoad(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	rt := start(t, cli, ns)
	r := router(t, cli, ns, "model", registry.LeastLoad("request_active_slots"))
	if _, err := r.Pick(); !errors.Is(err, registry.ErrNoEndpoints) {
		t.Fatalf("pick from no endpoints: %v", err)
	}
	regs := map[string]*registry.Registration{}
	for id, load := range map[string]int{"a": 5, "b": 2, "c": 9} {
		regs[id] = register(t, rt, "model", id, fmt.Sprintf(`{"request_active_slots":%d,"request_total_slots":10}`, load))
	}
	caughtUp(t, cli, r, ns)
	for range 5 {
		if in, _ := r.Pick(); in.ID != "b" {
			t.Fatalf("least load picked %s, want b (load 2)", in.ID)
		}
	}
	// b gets busy: a is now the least loaded.
	if err := regs["b"].Update(context.Background(), json.RawMessage(`{"request_active_slots":8}`)); err != nil {
		t.Fatal(err)
	}
	caughtUp(t, cli, r, ns)
	if in, _ := r.Pick(); in.ID != "a" {
		t.Fatalf("after b's update least load picked %s, want a", in.ID)
	}
	// Equal loads take turns.
	_ = regs["c"].Update(context.Background(), json.RawMessage(`{"request_active_slots":5}`))
	caughtUp(t, cli, r, ns)
	seen := map[string]int{}
	for range 10 {
		in, _ := r.Pick()
		seen[in.ID]++
	}
	if seen["a"] != 5 || seen["c"] != 5 {
		t.Fatalf("equal loads picked %v, want a and c 5 times each", seen)
	}
}

// TestRouterNeverPicksDeleted removes endpoints while the router picks: once
// the router has applied an endpoint's Delete, it is never picked again.
func TestRouterNeverPicksDeleted(t *testing.T) {
	// Not parallel: it reads the store's current revision as its own
	// change's.
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	for _, p := range []struct {
		name   string
		policy registry.Policy
	}{{"round robin", registry.RoundRobin()}, {"random", registry.Random()}, {"least load", registry.LeastLoad("load")}} {
		t.Run(p.name, func(t *testing.T) {
			rt := start(t, srv.Client(t), ns)
			component := "c" + fmt.Sprint(len(p.name))
			r := router(t, cli, ns, component, p.policy)
			var regs []*registry.Registration
			for i := range 10 {
				regs = append(regs, register(t, rt, component, fmt.Sprintf("e%d", i), `{"load":0}`))
			}
			caughtUp(t, cli, r, ns)
			seen := map[string]bool{}
			for range 100 {
				in, err := r.Pick()
				if err != nil {
					t.Fatal(err)
				}
				seen[in.ID] = true
			}
			if len(seen) < 5 {
				t.Fatalf("100 picks reached only %d of 10 endpoints", len(seen))
			}
			gone := map[string]bool{}
			for i := range 9 {
				if err := regs[i].Deregister(ctx); err != nil {
					t.Fatal(err)
				}
				gone[regs[i].Endpoint().ID] = true
				// Nothing else writes meanwhile: the current revision is the
				// Delete's.
				g, err := cli.Get(ctx, regs[i].Key())
				if err != nil || len(g.Kvs) != 0 {
					t.Fatalf("after deregister: %v %v", g, err)
				}
				wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err = r.WaitRevision(wctx, g.Header.Revision)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				for range 50 {
					in, err := r.Pick()
					if err != nil {
						t.Fatal(err)
					}
					if gone[in.ID] {
						t.Fatalf("picked %s after its Delete was applied", in.ID)
					}
				}
			}
			if in, _ := r.Pick(); in.ID != "e9" || len(r.Endpoints()) != 1 {
				t.Fatalf("last live endpoint %s, endpoints %v", in.ID, r.Endpoints())
			}
		})
	}
}

// TestReRegisteredEndpointFollowsNewLease: with WithReRegister, an endpoint
// whose lease is revoked behind the process's back comes back under the new
// lease, and the runtime keeps running.
func TestReRegisteredEndpointFollowsNewLease(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	rt := start(t, srv.Client(t), ns, process.WithReRegister())
	reg := register(t, rt, "router", "r1", `{"load":1}`)
	w := watch(t, cli, ns, "router")
	old := rt.Lease().ID()
	if _, err := cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w, 3*time.Second); ev.Type != registry.Delete {
		t.Fatalf("after revoke: %+v", ev)
	}
	ev := next(t, w, 5*time.Second)
	if ev.Type != registry.Put || ev.Instance.ID != "r1" || ev.Instance.Lease == int64(old) || ev.Instance.Lease != int64(rt.Lease().ID()) {
		t.Fatalf("re-registration %+v (old lease %x, runtime lease %x)", ev, int64(old), int64(rt.Lease().ID()))
	}
	if string(ev.Instance.Data) != `{"load":1}` {
		t.Fatalf("re-registered data %s", ev.Instance.Data)
	}
	if rt.Err() != nil {
		t.Fatalf("runtime stopped: %v", rt.Err())
	}
	waitFor := time.Now().Add(3 * time.Second)
	for reg.Lease().ID() != rt.Lease().ID() && time.Now().Before(waitFor) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := reg.Update(ctx, json.RawMessage(`{"load":2}`)); err != nil {
		t.Fatalf("update under the new lease: %v", err)
	}
}

// A router over the live endpoints of one component, picking the least
// loaded.
func ExampleRouter() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.ClientURL()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()
	rt, err := process.Start(ctx, cli, process.WithNamespace("example-router"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rt.Shutdown(ctx)
	for id, slots := range map[string]int{"gpu-0": 7, "gpu-1": 3} {
		data := json.RawMessage(fmt.Sprintf(`{"request_active_slots":%d}`, slots))
		if _, err := registry.Register(ctx, rt, "VllmWorker", registry.Endpoint{ID: id, Address: "127.0.0.1:8000", Data: data}); err != nil {
			fmt.Println(err)
			return
		}
	}
	w, err := registry.Watch(ctx, cli, rt.Namespace(), "VllmWorker")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Close(context.Background())
	r := registry.NewRouter(w, registry.LeastLoad("request_active_slots"))
	defer r.Close(context.Background())
	in, err := r.Pick()
	fmt.Println(in.ID, err)
	// Output: gpu-1 <nil>
}

// TestRouterAppliesWholeRevisions shuts down a process holding 300
// endpoints: its lease's revoke deletes them all at one revision, and once
// the router has applied that revision none of them may be picked.
func TestRouterAppliesWholeRevisions(t *testing.T) {
	// Not parallel: it reads the store's current revision as its own
	// change's.
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	keep := start(t, srv.Client(t), ns)
	register(t, keep, "model", "survivor", "")
	rt := start(t, srv.Client(t), ns)
	for i := range 300 {
		register(t, rt, "model", fmt.Sprintf("e%03d", i), "")
	}
	r := router(t, cli, ns, "model", registry.RoundRobin())
	if n := len(r.Endpoints()); n != 301 {
		t.Fatalf("router has %d endpoints, want 301", n)
	}
	if err := rt.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := cli.Get(ctx, "/"+ns+"/components/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != 1 {
		t.Fatalf("after shutdown %d keys (%v), want 1", g.Count, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.WaitRevision(wctx, g.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if eps := r.Endpoints(); len(eps) != 1 || eps[0].ID != "survivor" {
		t.Fatalf("after the revoke's revision was applied the router still has %d endpoints", len(eps))
	}
	for range 10 {
		if in, err := r.Pick(); err != nil || in.ID != "survivor" {
			t.Fatalf("picked %s (%v)", in.ID, err)
		}
	}
}

// TestReRegisterTakesOverOwnKey: when the old lease still holds the key, a
// re-registration moves the key to the new lease in place, and only a key
// bound to the process's own old lease can be taken over.
func TestReRegisterTakesOverOwnKey(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	rt := start(t, cli, ns)
	reg := register(t, rt, "router", "r1", `{"load":1}`)
	before := getKey(t, cli, reg.Key()).Kvs[0]
	next, err := lease.Grant(ctx, cli, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close(ctx)
	if err := registry.TakeOver(ctx, reg, next, rt.Lease().ID()); err != nil {
		t.Fatal(err)
	}
	after := getKey(t, cli, reg.Key()).Kvs[0]
	if after.Lease != int64(next.ID()) || after.CreateRevision != before.CreateRevision || string(after.Value) != string(before.Value) {
		t.Fatalf("take-over: lease %x (want %x), create revision %d (was %d)", after.Lease, int64(next.ID()), after.CreateRevision, before.CreateRevision)
	}
	if reg.Lease() != next {
		t.Fatal("registration does not follow the new lease")
	}
	// A key bound to a lease that is not the one named is not taken over.
	other, err := lease.Grant(ctx, cli, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	err = registry.TakeOver(ctx, reg, other, rt.Lease().ID())
	var de *registry.DuplicateError
	if !errors.As(err, &de) || de.Lease != next.ID() {
		t.Fatalf("take-over from the wrong lease: %v", err)
	}
	if got := getKey(t, cli, reg.Key()).Kvs[0]; got.Lease != int64(next.ID()) {
		t.Fatal("refused take-over changed the key")
	}
}
