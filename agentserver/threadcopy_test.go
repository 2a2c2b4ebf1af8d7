package agentserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestCopyThreadWithCheckpoints: a copy has the old thread's checkpoints
// and pending writes under its own id (their thread ids and metadata
// rewritten), its state and history with the new id in their checkpoints
// and metadata, and none of its runs; the old thread is untouched.
func TestCopyThreadWithCheckpoints(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	store, err := checkpoint.NewEtcd(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	first, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: th, Metadata: checkpoint.Metadata{Source: "input", Extra: map[string]json.RawMessage{"thread_id": json.RawMessage(`"` + th + `"`)}}, State: []byte(`{"n":1}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: th, ParentID: first.ID, Metadata: checkpoint.Metadata{Source: "loop"}, State: []byte(`{"n":2}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.PutWrites(ctx, th, "", second.ID, []checkpoint.Write{{TaskID: "t1", Channel: "n", Value: []byte("3")}}, nil); err != nil {
		t.Fatal(err)
	}
	ref := func(id string) map[string]any {
		return map[string]any{"thread_id": th, "checkpoint_ns": "", "checkpoint_id": id}
	}
	st := map[string]any{"values": map[string]any{"n": 2}, "next": []any{}, "tasks": []any{}, "metadata": map[string]any{"source": "loop", "step": 1},
		"checkpoint": ref(second.ID), "parent_checkpoint": ref(first.ID)}
	old := map[string]any{"values": map[string]any{"n": 1}, "next": []any{"agent"}, "tasks": []any{}, "metadata": map[string]any{"source": "input"},
		"checkpoint": ref(first.ID), "parent_checkpoint": nil}
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		r := p["run"].(map[string]any)
		a.must(200, "PUT", fmt.Sprintf("/v1/agent-server/threads/%s/runs/%s/outcome", r["thread_id"], r["run_id"]),
			map[string]any{"token": token, "status": "success", "state": st, "history": []any{st, old}})
		return nil
	})
	a.must(200, "POST", "/threads/"+th+"/runs/wait", map[string]any{"assistant_id": "agent", "input": 1})

	cp := a.must(200, "POST", "/threads/"+th+"/copy", nil).Obj
	id := cp["thread_id"].(string)
	if cp["status"] != "idle" || fmt.Sprint(cp["values"]) != "map[n:2]" || cp["metadata"].(map[string]any)["thread_id"] != id {
		t.Fatalf("copy %v: want idle, the old values, metadata.thread_id the new id", cp)
	}
	got, err := store.List(ctx, id, "", checkpoint.ListOptions{})
	if err != nil || len(got) != 2 {
		t.Fatalf("copy's checkpoints %v (%v): want 2", got, err)
	}
	if got[0].ID != second.ID || got[0].ThreadID != id || got[0].ParentID != first.ID || string(got[0].State) != `{"n":2}` || string(got[1].Metadata.Extra["thread_id"]) != `"`+id+`"` {
		t.Fatalf("copy's checkpoints %+v: want the old ones with the new thread id", got)
	}
	if head, err := store.GetLatest(ctx, id, ""); err != nil || head.ID != second.ID {
		t.Fatalf("copy's head %v (%v): want %s", head, err, second.ID)
	}
	if w, err := store.Writes(ctx, id, "", second.ID); err != nil || len(w) != 1 || string(w[0].Value) != "3" {
		t.Fatalf("copy's pending writes %v (%v): want the old one", w, err)
	}
	state := a.must(200, "GET", "/threads/"+id+"/state", nil).Obj
	if state["checkpoint"].(map[string]any)["thread_id"] != id || state["parent_checkpoint"].(map[string]any)["thread_id"] != id ||
		state["metadata"].(map[string]any)["thread_id"] != id || state["metadata"].(map[string]any)["step"] != float64(1) {
		t.Fatalf("copy's state %v: want the old one with the new thread id", state)
	}
	hist := a.must(200, "POST", "/threads/"+id+"/history", map[string]any{}).List
	if len(hist) != 2 || hist[1]["parent_checkpoint"] != nil || hist[1]["checkpoint"].(map[string]any)["thread_id"] != id {
		t.Fatalf("copy's history %v: want the old two with the new thread id", hist)
	}
	if runs := a.must(200, "GET", "/threads/"+id+"/runs", nil).List; len(runs) != 0 {
		t.Fatalf("copy's runs %v: want none, as LangGraph", runs)
	}
	if o := a.must(200, "GET", "/threads/"+th+"/state", nil).Obj; o["checkpoint"].(map[string]any)["thread_id"] != th {
		t.Fatalf("old thread's state %v changed", o)
	}
	if o, err := store.List(ctx, th, "", checkpoint.ListOptions{}); err != nil || len(o) != 2 || o[0].ThreadID != th {
		t.Fatalf("old thread's checkpoints %v (%v) changed", o, err)
	}
	// Deleting the copy deletes its checkpoints, not the old thread's.
	a.must(204, "DELETE", "/threads/"+id, nil)
	sp := keyspace.MustNew(a.ns)
	if n, err := a.cli.Get(ctx, sp.Checkpoints(id), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || n.Count != 0 {
		t.Fatalf("copy's checkpoint keys after its delete: %v (%v)", n, err)
	}
	if o, err := store.List(ctx, th, "", checkpoint.ListOptions{}); err != nil || len(o) != 2 {
		t.Fatalf("old thread's checkpoints %v (%v) after the copy's delete", o, err)
	}
}

// TestPruneAndPatchState: keep_latest keeps a thread with its latest
// checkpoint alone; a state's metadata patch reaches the checkpoint
// store; delete deletes the threads named, counting those that were.
func TestPruneAndPatchState(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	store, err := checkpoint.NewEtcd(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	first, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: th, Metadata: checkpoint.Metadata{Source: "input"}, State: []byte(`{}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.PutWrites(ctx, th, "", first.ID, []checkpoint.Write{{TaskID: "t", Channel: "c", Value: []byte("1")}}, nil); err != nil {
		t.Fatal(err)
	}
	second, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: th, ParentID: first.ID, Metadata: checkpoint.Metadata{Source: "loop"}, State: []byte(`{}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.PutWrites(ctx, th, "", second.ID, []checkpoint.Write{{TaskID: "t", Channel: "c", Value: []byte("2")}}, nil); err != nil {
		t.Fatal(err)
	}
	ref := func(id string) map[string]any {
		return map[string]any{"thread_id": th, "checkpoint_ns": "", "checkpoint_id": id}
	}
	st := map[string]any{"values": map[string]any{}, "next": []any{}, "tasks": []any{}, "metadata": map[string]any{"source": "loop"}, "checkpoint": ref(second.ID)}
	old := map[string]any{"values": map[string]any{}, "next": []any{}, "tasks": []any{}, "metadata": map[string]any{}, "checkpoint": ref(first.ID)}
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		r := p["run"].(map[string]any)
		a.must(200, "PUT", fmt.Sprintf("/v1/agent-server/threads/%s/runs/%s/outcome", r["thread_id"], r["run_id"]),
			map[string]any{"token": token, "status": "success", "state": st, "history": []any{st, old}})
		return nil
	})
	a.must(200, "POST", "/threads/"+th+"/runs/wait", map[string]any{"assistant_id": "agent", "input": 1})

	a.must(204, "PATCH", "/threads/"+th+"/state", map[string]any{"metadata": map[string]any{"label": "ok"}})
	if md := a.must(200, "GET", "/threads/"+th+"/state", nil).Obj["metadata"].(map[string]any); md["label"] != "ok" || md["source"] != "loop" {
		t.Fatalf("state metadata %v: want the patch merged", md)
	}
	if cp, err := store.GetLatest(ctx, th, ""); err != nil || string(cp.Metadata.Extra["label"]) != `"ok"` || cp.Metadata.Source != "loop" {
		t.Fatalf("latest checkpoint %+v (%v): want the patch merged", cp, err)
	}
	if h := a.must(200, "POST", "/threads/"+th+"/history", map[string]any{"limit": 1}).List; h[0]["metadata"].(map[string]any)["label"] != "ok" {
		t.Fatalf("history's newest state's metadata %v: want the patch merged", h[0]["metadata"])
	}

	got := a.must(200, "POST", "/threads/prune", map[string]any{"thread_ids": []any{th}, "strategy": "keep_latest"}).Obj
	if got["pruned_count"] != float64(1) {
		t.Fatalf("prune answered %v", got)
	}
	if l, err := store.List(ctx, th, "", checkpoint.ListOptions{}); err != nil || len(l) != 1 || l[0].ID != second.ID {
		t.Fatalf("checkpoints after keep_latest %v (%v): want the latest alone", l, err)
	}
	if w, err := store.Writes(ctx, th, "", first.ID); err != nil || len(w) != 0 {
		t.Fatalf("old checkpoint's writes %v (%v): want none", w, err)
	}
	if w, err := store.Writes(ctx, th, "", second.ID); err != nil || len(w) != 1 || string(w[0].Value) != "2" {
		t.Fatalf("latest checkpoint's writes %v (%v): want its one write kept", w, err)
	}
	if h := a.must(200, "POST", "/threads/"+th+"/history", map[string]any{}).List; len(h) != 1 {
		t.Fatalf("history after keep_latest %v: want the latest state alone", h)
	}
	missing := "00000000-0000-4000-8000-000000000000"
	got = a.must(200, "POST", "/threads/prune", map[string]any{"thread_ids": []any{th, missing}}).Obj
	if got["pruned_count"] != float64(1) {
		t.Fatalf("prune delete answered %v: want the one thread that was", got)
	}
	a.must(404, "GET", "/threads/"+th, nil)
	a.must(400, "POST", "/threads/prune", map[string]any{"thread_ids": []any{"x"}})
}

// TestCopyLargeCheckpoints: a copy of checkpoints together larger than
// one etcd request writes them in several.
func TestCopyLargeCheckpoints(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	store, err := checkpoint.NewEtcd(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	state := []byte(`{"s":"` + strings.Repeat("x", 600<<10) + `"}`)
	parent := ""
	for range 3 {
		cp, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: th, ParentID: parent, Metadata: checkpoint.Metadata{Source: "loop"}, State: state}, nil)
		if err != nil {
			t.Fatal(err)
		}
		parent = cp.ID
	}
	id := a.must(200, "POST", "/threads/"+th+"/copy", nil).Obj["thread_id"].(string)
	got, err := store.List(ctx, id, "", checkpoint.ListOptions{})
	if err != nil || len(got) != 3 || len(got[0].State) != len(state) {
		t.Fatalf("copy's checkpoints %d (%v): want the 3", len(got), err)
	}
}

// TestPruneKeepsAConcurrentPatch: a metadata patch of a thread of the
// previous layout (its history in its state record) made while a
// keep_latest prune of it is under way is kept: the prune, which rewrites
// that record, compares it, reads again and prunes what the patch left.
func TestPruneKeepsAConcurrentPatch(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	sp := keyspace.MustNew(a.ns)
	th, store, first := threadWithInput(t, a)
	second, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: th, ParentID: first.ID, Metadata: checkpoint.Metadata{Source: "loop"}, State: []byte(`{}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	state := func(id, source string) map[string]any {
		return map[string]any{"values": map[string]any{}, "next": []any{}, "tasks": []any{}, "metadata": map[string]any{"source": source},
			"checkpoint": map[string]any{"thread_id": th, "checkpoint_ns": "", "checkpoint_id": id}}
	}
	raw, _ := json.Marshal(map[string]any{"state": state(second.ID, "loop"), "history": []any{state(second.ID, "loop"), state(first.ID, "input")}})
	if _, err := a.cli.Put(ctx, sp.AgentThreadState(th), string(raw)); err != nil {
		t.Fatal(err)
	}
	calls := 0
	defer agentserver.SetBeforePruneCommit(func() {
		if calls++; calls == 1 {
			a.must(204, "PATCH", "/threads/"+th+"/state", map[string]any{"metadata": map[string]any{"label": "ok"}})
		}
	})()
	if got := a.must(200, "POST", "/threads/prune", map[string]any{"thread_ids": []any{th}, "strategy": "keep_latest"}).Obj; got["pruned_count"] != float64(1) {
		t.Fatalf("prune answered %v", got)
	}
	if calls != 2 {
		t.Fatalf("the prune read %d times: want again after the patch", calls)
	}
	if md := a.must(200, "GET", "/threads/"+th+"/state", nil).Obj["metadata"].(map[string]any); md["label"] != "ok" {
		t.Fatalf("state metadata after the prune %v: want the patch kept", md)
	}
	h := a.must(200, "POST", "/threads/"+th+"/history", map[string]any{}).List
	if len(h) != 1 || h[0]["metadata"].(map[string]any)["label"] != "ok" {
		t.Fatalf("history after the prune %v: want the latest state alone, patched", h)
	}
	if l, err := store.List(ctx, th, "", checkpoint.ListOptions{}); err != nil || len(l) != 1 || l[0].ID != second.ID {
		t.Fatalf("checkpoints after keep_latest %v (%v): want the latest alone", l, err)
	}
}

// TestCopySweepsACrashedCopy: a copy leaves no mark behind; the keys of a
// copy interrupted by a crash (its mark older than ten minutes, no thread
// of its id) are deleted by the next copy, with the mark; a younger
// mark's keys, and those of a thread that exists, are left alone.
func TestCopySweepsACrashedCopy(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	sp := keyspace.MustNew(a.ns)
	th, _, _ := threadWithInput(t, a)
	orphan := func(id string, age time.Duration) {
		mark, _ := json.Marshal(map[string]any{"from": th, "started_at": time.Now().Add(-age)})
		for k, v := range map[string]string{sp.Checkpoints(id) + "x": "1", sp.AgentThreadHistory(id) + "states/1": "{}", sp.AgentThreadCopy(id): string(mark)} {
			if _, err := a.cli.Put(ctx, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func(prefix string) int64 {
		r, err := a.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	crashed, young := "00000000-0000-4000-8000-0000000000aa", "00000000-0000-4000-8000-0000000000bb"
	orphan(crashed, time.Hour)
	orphan(young, time.Minute)
	old, _ := json.Marshal(map[string]any{"from": th, "started_at": time.Now().Add(-time.Hour)})
	if _, err := a.cli.Put(ctx, sp.AgentThreadCopy(th), string(old)); err != nil { // a thread that exists
		t.Fatal(err)
	}

	cp := a.must(200, "POST", "/threads/"+th+"/copy", nil).Obj["thread_id"].(string)
	if n := count(sp.AgentThreadCopy(cp)); n != 0 {
		t.Fatalf("the copy left its mark (%d keys)", n)
	}
	if n := count(sp.Checkpoints(crashed)) + count(sp.AgentThreadHistory(crashed)) + count(sp.AgentThreadCopy(crashed)); n != 0 {
		t.Fatalf("%d keys of a copy crashed an hour ago are left: want none", n)
	}
	if n := count(sp.Checkpoints(young)) + count(sp.AgentThreadHistory(young)) + count(sp.AgentThreadCopy(young)); n != 3 {
		t.Fatalf("%d keys of a copy marked a minute ago are left: want its 3", n)
	}
	if n := count(sp.Checkpoints(th)); n == 0 {
		t.Fatalf("the copied thread's checkpoints were swept")
	}
	if n := count(sp.AgentThreadCopy(th)); n != 0 {
		t.Fatalf("an old mark of a thread that exists was kept: want it deleted alone")
	}
	a.must(200, "GET", "/threads/"+th, nil)
	a.must(200, "GET", "/threads/"+cp, nil)
}

// threadWithInput makes a thread with one checkpoint in the checkpoint
// store, its input, and answers them with the store.
func threadWithInput(t *testing.T, a *api) (string, *checkpoint.Etcd, checkpoint.Checkpoint) {
	t.Helper()
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	store, err := checkpoint.NewEtcd(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	first, err := store.Put(context.Background(), checkpoint.Checkpoint{ThreadID: th, Metadata: checkpoint.Metadata{Source: "input"}, State: []byte(`{}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return th, store, first
}

// TestCopySweptWhileItRunsFails: a copy taken for a crashed one while it
// still runs (its mark made to look an hour old, another copy sweeping)
// fails with 409 and creates no thread, rather than one without its
// checkpoints; a copy after it succeeds.
func TestCopySweptWhileItRunsFails(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	sp := keyspace.MustNew(a.ns)
	th, _, _ := threadWithInput(t, a)
	other, _, _ := threadWithInput(t, a)
	swept := false
	restore := agentserver.SetAfterCopyCheckpoints(func(id string) {
		if swept {
			return
		}
		swept = true
		old, _ := json.Marshal(map[string]any{"from": th, "started_at": time.Now().Add(-time.Hour)})
		if _, err := a.cli.Put(ctx, sp.AgentThreadCopy(id), string(old)); err != nil {
			t.Error(err)
		}
		a.must(200, "POST", "/threads/"+other+"/copy", nil) // sweeps the mark it finds an hour old
	})
	defer restore()
	if got := a.do("POST", "/threads/"+th+"/copy", nil); got.Status != 409 || !strings.Contains(string(got.Raw), "copy the thread again") {
		t.Fatalf("a copy swept while it ran: %d %s, want 409 saying to copy again", got.Status, got.Raw)
	}
	restore()
	if n := a.must(200, "POST", "/threads/search", map[string]any{"limit": 100}).List; len(n) != 3 {
		t.Fatalf("%d threads after the swept copy: want the two and the other's copy", len(n))
	}
	a.must(200, "POST", "/threads/"+th+"/copy", nil)
}
