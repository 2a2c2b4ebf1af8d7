package agentserver_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// claimReads counts the reads of one claim key through the KV it wraps:
// the transactions that get it, as the queue's check of a held claim
// (queue.Client.StreamClaim) does.
type claimReads struct {
	clientv3.KV
	key atomic.Pointer[string]
	n   atomic.Int64
}

func (k *claimReads) Txn(ctx context.Context) clientv3.Txn {
	return &claimReadsTxn{Txn: k.KV.Txn(ctx), kv: k}
}

// watch starts counting the reads of key, from 0.
func (k *claimReads) watch(key string) {
	k.key.Store(&key)
	k.n.Store(0)
}

type claimReadsTxn struct {
	clientv3.Txn
	kv *claimReads
}

func (t *claimReadsTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *claimReadsTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	if key := t.kv.key.Load(); key != nil {
		for _, op := range ops {
			if op.IsGet() && string(op.KeyBytes()) == *key {
				t.kv.n.Add(1)
			}
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *claimReadsTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

// newCountingAPI is newAPI whose server counts the reads of a claim key
// (see claimReads.watch).
func newCountingAPI(t *testing.T) (*api, *claimReads) {
	cli := srv.LocalClient(t)
	kv := &claimReads{KV: cli.KV}
	cli.KV = kv
	return newAPI(t, func(c *httpapi.Config) { c.Etcd = cli }), kv
}

func (s started) appendEvents(a *api, session string, token int64, data any) answer {
	a.t.Helper()
	return a.do("POST", "/v1/tasks/"+s.id+"/stream/events", map[string]any{"session": session, "token": token, "events": []any{ev("values", data)}})
}

// A run's start reads the claim of the run's task; its appends and its
// outcome write under the claim the start read, without reading it
// again.
func TestRunReadsItsClaimOnce(t *testing.T) {
	t.Parallel()
	a, kv := newCountingAPI(t)
	s := claimedRun(t, a, true)
	kv.watch(keyspace.MustNew(a.ns).QueueClaim(agentserver.RunsQueue, s.id))
	st := s.startWith(a, s.token, []any{ev("metadata", nil)})
	if st.Status != 200 || st.Obj["lock"] == nil {
		t.Fatalf("start: %d %s", st.Status, st.Raw)
	}
	if n := kv.n.Load(); n != 1 {
		t.Fatalf("the start read the claim %d times, want once", n)
	}
	for i := range 2 {
		if ans := s.appendEvents(a, s.session, s.token, i); ans.Status != 200 {
			t.Fatalf("append %d: %d %s", i, ans.Status, ans.Raw)
		}
	}
	if out := s.outcomeWith(a, s.token, outcomeLock(st), []any{ev("end", nil)}, 5); out.Status != 200 || out.Obj["status"] != "success" {
		t.Fatalf("outcome: %d %s", out.Status, out.Raw)
	}
	if n := kv.n.Load(); n != 1 {
		t.Fatalf("the run's start, two appends and outcome read the claim %d times, want once", n)
	}
	if types, _ := streamTypes(a, s.id); strings.Join(types, ",") != "attempt_started,metadata,values,values,end" {
		t.Fatalf("stream %v", types)
	}
}

// A claim lost after the start cached it (the run cancelled, or its task
// claimed again under another token when the runtime's session ended)
// refuses the runtime's append and outcome as a claim read then does:
// 409, nothing stored, the run not ended by it; whichever of them comes
// first meets the cached claim (an outcome's events, when it has some,
// before its transaction).
func TestLostClaimRefusedThoughCached(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	lose := map[string]func(s started){
		"cancel": func(s started) { a.must(204, "POST", "/threads/"+s.th+"/runs/"+s.id+"/cancel", nil) },
		"claimed again": func(s started) {
			a.must(204, "DELETE", "/v1/sessions/"+s.session, nil)
			other := a.must(201, "POST", "/v1/sessions", map[string]any{"ttl": 30}).Obj["id"].(string)
			got := a.must(200, "POST", "/v1/queues/langgraph/claim", map[string]any{"session": other, "wait": "10s"}).Obj["tasks"].([]any)
			if len(got) != 1 || got[0].(map[string]any)["task_id"] != s.id || int64(got[0].(map[string]any)["token"].(float64)) == s.token {
				t.Fatalf("claimed again: %v, want run %s under another token", got, s.id)
			}
		},
	}
	for _, how := range []string{"cancel", "claimed again"} {
		for _, first := range []string{"append", "outcome", "outcome with events"} {
			s := claimedRun(t, a, true)
			st := s.start(a)
			if st.Status != 200 || st.Obj["lock"] == nil {
				t.Fatalf("start: %d %s", st.Status, st.Raw)
			}
			a.must(200, "POST", "/v1/tasks/"+s.id+"/stream/events", map[string]any{"session": s.session, "token": s.token, "events": []any{ev("values", 0)}})
			lose[how](s)
			types, _ := streamTypes(a, s.id)
			status := a.must(200, "GET", "/threads/"+s.th+"/runs/"+s.id, nil).Obj["status"]
			appendRefused := func() {
				if ans := s.appendEvents(a, s.session, s.token, 1); ans.Status != 409 {
					t.Fatalf("%s, %s first: append under the lost claim: %d %s, want 409", how, first, ans.Status, ans.Raw)
				}
			}
			outcomeRefused := func() {
				var events []any // an outcome's events are appended under the claim before its transaction
				if first == "outcome with events" {
					events = []any{ev("end", nil)}
				}
				ans := s.outcomeWith(a, s.token, outcomeLock(st), events, 3)
				if ans.Status != 409 || !strings.Contains(ans.Raw, "no longer holds the run under token") {
					t.Fatalf("%s, %s first: outcome under the lost claim: %d %s, want 409", how, first, ans.Status, ans.Raw)
				}
			}
			if first == "append" {
				appendRefused()
				outcomeRefused()
			} else {
				outcomeRefused()
				appendRefused()
			}
			if now, _ := streamTypes(a, s.id); strings.Join(now, ",") != strings.Join(types, ",") {
				t.Fatalf("%s, %s first: refused writes changed the stream: %v, then %v", how, first, types, now)
			}
			if now := a.must(200, "GET", "/threads/"+s.th+"/runs/"+s.id, nil).Obj["status"]; now != status {
				t.Fatalf("%s, %s first: the refused outcome changed the run: %v, then %v", how, first, status, now)
			}
		}
	}
}

// The claim a start cached is its session's: an append with the same
// token under another session is refused as it is without the cache.
func TestCachedClaimIsItsSessions(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := claimedRun(t, a, false)
	if st := s.start(a); st.Status != 200 {
		t.Fatalf("start: %d %s", st.Status, st.Raw)
	}
	other := a.must(201, "POST", "/v1/sessions", map[string]any{"ttl": 30}).Obj["id"].(string)
	if ans := s.appendEvents(a, other, s.token, 1); ans.Status != 409 || !strings.Contains(ans.Raw, "another session") {
		t.Fatalf("append under another session: %d %s, want 409", ans.Status, ans.Raw)
	}
	wrong := s.session[:strings.Index(s.session, ".")+1] + strings.Repeat("a", 32)
	if ans := s.appendEvents(a, wrong, s.token, 1); ans.Status != 409 {
		t.Fatalf("append under the session's lease with another secret: %d %s, want 409", ans.Status, ans.Raw)
	}
	if types, _ := streamTypes(a, s.id); len(types) != 0 {
		t.Fatalf("stream %v after refused appends, want none", types)
	}
	if ans := s.appendEvents(a, s.session, s.token, 1); ans.Status != 200 {
		t.Fatalf("append under the claim's session: %d %s", ans.Status, ans.Raw)
	}
}
