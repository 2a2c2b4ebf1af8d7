package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// collector reads a watcher's events into a list and a live set.
type collector struct {
	mu     sync.Mutex
	events []registry.Event
	live   map[string]registry.Instance
	done   chan struct{}
}

func collect(w *registry.Watcher) *collector {
	c := &collector{live: map[string]registry.Instance{}, done: make(chan struct{})}
	snap, _ := w.Snapshot()
	for _, in := range snap {
		c.live[in.Component+"/"+in.ID] = in
	}
	go func() {
		defer close(c.done)
		for ev := range w.Events() {
			c.mu.Lock()
			c.events = append(c.events, ev)
			if ev.Type == registry.Put {
				c.live[ev.Instance.Component+"/"+ev.Instance.ID] = ev.Instance
			} else {
				delete(c.live, ev.Instance.Component+"/"+ev.Instance.ID)
			}
			c.mu.Unlock()
		}
	}()
	return c
}

// liveKeys returns the collector's live set as sorted "component/id@modrev".
func (c *collector) liveKeys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k, in := range c.live {
		out = append(out, fmt.Sprintf("%s@%d", k, in.ModRevision))
	}
	sort.Strings(out)
	return out
}

func (c *collector) lastRevision() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.events) == 0 {
		return 0
	}
	return c.events[len(c.events)-1].Revision
}

// etcdLive returns what etcd holds, in the form of liveKeys, and its
// revision.
func etcdLive(t *testing.T, cli *clientv3.Client, ns string) ([]string, int64) {
	t.Helper()
	list, rev, err := registry.List(context.Background(), cli, ns, "")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range list {
		out = append(out, fmt.Sprintf("%s/%s@%d", in.Component, in.ID, in.ModRevision))
	}
	sort.Strings(out)
	return out, rev
}

// settle waits until the collector has caught up with etcd's last change
// under ns and returns etcd's live set.
func settle(t *testing.T, cli *clientv3.Client, ns string, c *collector) []string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		want, rev := etcdLive(t, cli, ns)
		got := c.liveKeys()
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return want
		}
		if time.Now().After(deadline) {
			t.Fatalf("watcher's live set (%d) never matched etcd's (%d at revision %d)\n got %v\nwant %v", len(got), len(want), rev, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatcherFollowsChurn opens watchers while 1,000 endpoints register,
// update their load and go away (deregistered, their process shut down, or
// their lease left to expire). Each watcher must end with exactly etcd's live
// set, and deliver exactly the changes a raw etcd watch from the same
// revision sees: same order, no gap, no duplicate.
func TestWatcherFollowsChurn(t *testing.T) {
	// Not parallel: 100 writes must fit in the life of a 2 s lease.
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	keys := keyspace.MustNew(ns)
	ctx := context.Background()

	// Some endpoints exist before the watcher opens: they are its snapshot.
	rts := make([]*process.Runtime, 10)
	for i := range rts {
		rts[i] = start(t, srv.Client(t), ns, process.WithTTL(5*time.Second))
	}
	var regs []*registry.Registration
	for i := range 100 {
		regs = append(regs, register(t, rts[i%10], "worker", fmt.Sprintf("w%04d", i), `{"load":0}`))
	}
	w := watch(t, cli, ns, "")
	snap, rev := w.Snapshot()
	if len(snap) != 100 {
		t.Fatalf("snapshot has %d endpoints, want 100", len(snap))
	}
	c := collect(w)
	// A raw etcd watch from the same revision is the reference.
	rawCtx, rawCancel := context.WithCancel(ctx)
	defer rawCancel()
	raw := cli.Watch(rawCtx, keys.Components(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))

	// Churn: 900 more registrations, 2,000 load updates, 150 deregistered,
	// one process (100 endpoints) shut down, and 100 endpoints under a lease
	// nobody renews, which expires.
	for i := 100; i < 1000; i++ {
		if i >= 900 {
			continue
		}
		regs = append(regs, register(t, rts[i%10], "worker", fmt.Sprintf("w%04d", i), `{"load":0}`))
	}
	dying, err := cli.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i := 900; i < 1000; i++ {
		ep, _ := json.Marshal(registry.Endpoint{ID: fmt.Sprintf("w%04d", i), Address: "127.0.0.1:1"})
		if _, err := cli.Put(ctx, keys.Endpoint("model", fmt.Sprintf("w%04d", i)), string(ep), clientv3.WithLease(dying.ID)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 500 {
				reg := regs[r.IntN(len(regs))]
				_ = reg.Update(ctx, json.RawMessage(fmt.Sprintf(`{"load":%d}`, r.IntN(100))))
			}
		}()
	}
	for i := 0; i < 150; i++ {
		if err := regs[i*5].Deregister(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rts[3].Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	// Wait for the unrenewed lease to expire.
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, _, err := registry.List(ctx, cli, ns, "model")
		if err != nil {
			t.Fatal(err)
		}
		if len(list) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d endpoints left under an expired lease", len(list))
		}
		time.Sleep(100 * time.Millisecond)
	}
	want := settle(t, cli, ns, c)
	if len(want) < 500 || len(want) > 700 {
		t.Fatalf("live set of %d endpoints; the churn should leave about 650", len(want))
	}

	// Same sequence as the raw watch.
	_, endRev := etcdLive(t, cli, ns)
	var ref []string
	for len(ref) == 0 || refRev(ref) < c.lastRevision() {
		select {
		case resp := <-raw:
			for _, ev := range resp.Events {
				ref = append(ref, fmt.Sprintf("%s %s@%d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("raw watch stalled at %d events (watcher at revision %d, etcd at %d)", len(ref), c.lastRevision(), endRev)
		}
	}
	c.mu.Lock()
	var got []string
	prev := rev
	for _, ev := range c.events {
		if ev.Revision < prev {
			t.Fatalf("event at revision %d after one at %d", ev.Revision, prev)
		}
		prev = ev.Revision
		typ := "PUT"
		if ev.Type == registry.Delete {
			typ = "DELETE"
		}
		got = append(got, fmt.Sprintf("%s %s@%d", typ, keys.Endpoint(ev.Instance.Component, ev.Instance.ID), ev.Revision))
	}
	c.mu.Unlock()
	if len(got) != len(ref) {
		t.Fatalf("watcher delivered %d events, a raw etcd watch %d", len(got), len(ref))
	}
	for i := range got {
		if got[i] != ref[i] {
			t.Fatalf("event %d: watcher %q, raw watch %q", i, got[i], ref[i])
		}
	}
	if w.Relists() != 0 {
		t.Fatalf("watcher re-listed %d times without a compaction or restart", w.Relists())
	}
	t.Logf("%d events, %d live endpoints at the end", len(got), len(want))
}

// refRev returns the revision of the last event in ref ("TYPE key@rev").
func refRev(ref []string) int64 {
	var rev int64
	s := ref[len(ref)-1]
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '@' {
			_, _ = fmt.Sscan(s[i+1:], &rev)
			break
		}
	}
	return rev
}

// TestWatcherRecoversFromCompaction compacts away the revision a watcher
// starts from (between its snapshot and its first watch): it must read the
// endpoints again and end with exactly the live set.
func TestWatcherRecoversFromCompaction(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	rt := start(t, cli, ns)
	var regs []*registry.Registration
	for i := range 20 {
		regs = append(regs, register(t, rt, "worker", fmt.Sprintf("w%d", i), `{"load":0}`))
	}
	hooked := make(chan struct{})
	w := watch(t, cli, ns, "", registry.WithStartHook(func() {
		// Between the snapshot and the watch: remove 5, update 5, add 5,
		// then compact everything up to now.
		for i := range 5 {
			_ = regs[i].Deregister(ctx)
			_ = regs[5+i].Update(ctx, json.RawMessage(`{"load":9}`))
			if _, err := registry.Register(ctx, rt, "worker", registry.Endpoint{ID: fmt.Sprintf("new%d", i), Address: "x"}); err != nil {
				t.Error(err)
			}
		}
		defer close(hooked)
		g, err := cli.Get(ctx, "compact-marker")
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := cli.Compact(ctx, g.Header.Revision); err != nil {
			t.Error(err)
		}
	}))
	c := collect(w)
	<-hooked
	settle(t, cli, ns, c)
	if w.Relists() < 1 {
		t.Fatal("watcher did not re-list after its start revision was compacted")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var puts, deletes int
	for _, ev := range c.events {
		if ev.Type == registry.Put {
			puts++
		} else {
			deletes++
		}
	}
	if puts != 10 || deletes != 5 {
		t.Fatalf("re-list emitted %d puts and %d deletes, want 10 (5 updated + 5 new) and 5", puts, deletes)
	}
}

// TestWatcherSurvivesEtcdRestart stops etcd under a watcher, changes the
// registry after it is back, and expects the watcher to deliver the changes.
func TestWatcherSurvivesEtcdRestart(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "etcd")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	url := "http://" + etcdtest.FreeAddr()
	own, err := etcdtest.Start(etcdtest.Options{Dir: dir, ClientURL: url})
	if err != nil {
		t.Fatal(err)
	}
	// Stopped after the watcher and client are closed (cleanups run last
	// first), so that the final stop does not wait for their streams.
	t.Cleanup(func() { own.Stop() })
	cli := own.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	keys := keyspace.MustNew(ns)
	put := func(id string) {
		t.Helper()
		ep, _ := json.Marshal(registry.Endpoint{ID: id, Address: "127.0.0.1:1"})
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if _, err := cli.Put(cctx, keys.Endpoint("model", id), string(ep)); err != nil {
			t.Fatal(err)
		}
	}
	put("before")
	w := watch(t, cli, ns, "model")
	c := collect(w)
	put("a")
	own.Stop() // waits for the open watch stream up to etcd's request timeout
	time.Sleep(500 * time.Millisecond)
	own, err = etcdtest.Start(etcdtest.Options{Dir: dir, ClientURL: url})
	if err != nil {
		t.Fatal(err)
	}
	put("b")
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := cli.Delete(dctx, keys.Endpoint("model", "before")); err != nil {
		t.Fatal(err)
	}
	got := settle(t, cli, ns, c)
	if len(got) != 2 {
		t.Fatalf("live set after restart %v, want a and b", got)
	}
	// Resumed, not re-read: exactly the three changes, in order.
	if w.Relists() != 0 {
		t.Fatalf("watcher re-read %d times across a restart with data kept", w.Relists())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var seq []string
	for i, ev := range c.events {
		seq = append(seq, ev.Type.String()+" "+ev.Instance.ID)
		if i > 0 && ev.Revision <= c.events[i-1].Revision {
			t.Fatalf("events out of order: %+v", c.events)
		}
	}
	if fmt.Sprint(seq) != "[put a put b delete before]" {
		t.Fatalf("events across the restart %v", seq)
	}
}
