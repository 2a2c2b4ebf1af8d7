package agentserver_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestWritesStoreFull: past the high-water mark creating and changing
// assistants and threads are 507 problems with Retry-After, and write
// nothing; reads still answer, and writes resume once the guard clears.
func TestWritesStoreFull(t *testing.T) {
	a := newAPI(t)
	asst := a.must(200, "POST", "/assistants", map[string]any{"graph_id": "agent"}).Obj["assistant_id"].(string)
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	keys := keyspace.MustNew(a.ns)
	ctx := context.Background()
	if err := storeguard.Set(ctx, a.cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.8, LowWater: 0.7, Since: time.Now()}, keys); err != nil {
		t.Fatal(err)
	}
	before := keyCount(t, a)
	for _, c := range []struct {
		name, method, path string
		body               map[string]any
	}{
		{"create assistant", "POST", "/assistants", map[string]any{"graph_id": "agent"}},
		{"create assistant, its id taken", "POST", "/assistants", map[string]any{"graph_id": "agent", "assistant_id": asst}},
		{"patch assistant", "PATCH", "/assistants/" + asst, map[string]any{"name": "x"}},
		{"set latest", "POST", "/assistants/" + asst + "/latest", map[string]any{"version": 1}},
		{"create thread", "POST", "/threads", map[string]any{}},
		{"create thread, its id taken", "POST", "/threads", map[string]any{"thread_id": th, "if_exists": "do_nothing"}},
		{"patch thread", "PATCH", "/threads/" + th, map[string]any{"metadata": map[string]any{"k": 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ans := a.must(507, c.method, c.path, c.body)
			if ans.Header.Get("Retry-After") == "" || ans.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("507 without Retry-After or not a problem: %v %s", ans.Header, ans.Raw)
			}
		})
	}
	if n := keyCount(t, a); n != before {
		t.Fatalf("writes past the high-water mark changed the keys: %d, then %d", before, n)
	}
	a.must(200, "GET", "/assistants/"+asst, nil)
	if err := storeguard.Clear(ctx, a.cli, keys); err != nil {
		t.Fatal(err)
	}
	a.must(200, "PATCH", "/threads/"+th, map[string]any{"metadata": map[string]any{"k": 1}})
}

func keyCount(t *testing.T, a *api) int64 {
	t.Helper()
	resp, err := a.cli.Get(context.Background(), keyspace.MustNew(a.ns).Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// TestDeleteAssistantThreadsWhileTheyChange: threads of the assistant
// that change while delete_threads runs are read again and deleted, not
// left behind.
func TestDeleteAssistantThreadsWhileTheyChange(t *testing.T) {
	a := newAPI(t)
	id := a.must(200, "POST", "/assistants", map[string]any{"graph_id": "agent"}).Obj["assistant_id"].(string)
	var threads []string
	for range 8 {
		threads = append(threads, a.must(200, "POST", "/threads", map[string]any{"metadata": map[string]any{"assistant_id": id}}).Obj["thread_id"].(string))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, th := range threads {
		wg.Add(1)
		go func() { // patch the thread until it is gone or the deletion is over
			defer wg.Done()
			for i := 0; i < 200; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if a.do("PATCH", "/threads/"+th, map[string]any{"metadata": map[string]any{"i": i}}).Status != 200 {
					return
				}
			}
		}()
	}
	for try := 0; ; try++ { // a deletion that lost every race is a 409: sent again, it finishes
		st := a.do("DELETE", "/assistants/"+id+"?delete_threads=true", nil).Status
		if st == 204 {
			break
		}
		if st != 409 || try == 4 {
			t.Fatalf("delete with its threads: status %d after %d tries, want 204", st, try+1)
		}
	}
	close(stop)
	wg.Wait()
	for _, th := range threads {
		a.must(404, "GET", "/threads/"+th, nil)
	}
	a.must(404, "GET", "/assistants/"+id, nil)
}

// TestUndecodableRecordHidesItsKey: a stored thread that does not decode
// is a 500 naming the thread by id, never by its key in etcd.
func TestUndecodableRecordHidesItsKey(t *testing.T) {
	a := newAPI(t)
	id := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	key := keyspace.MustNew(a.ns).AgentThread(id)
	if _, err := a.cli.Put(context.Background(), key, "{not json"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []answer{a.do("GET", "/threads/"+id, nil), a.do("POST", "/threads/search", map[string]any{})} {
		if r.Status != 500 || !strings.Contains(r.Raw, id) || strings.Contains(r.Raw, key) || strings.Contains(r.Raw, a.ns+"/") {
			t.Fatalf("undecodable thread: %d %s; want a 500 naming %s, not its key %s", r.Status, r.Raw, id, key)
		}
	}
}
