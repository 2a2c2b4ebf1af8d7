package agentserver_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// sseEvent is one event of an SSE answer.
type sseEvent struct{ event, data, id string }

// followSSE GETs path as a stream (with Last-Event-ID last, unless "")
// and sends its events on the channel, until ctx ends.
func followSSE(ctx context.Context, t *testing.T, a *api, path, last string) <-chan sseEvent {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", a.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	out := make(chan sseEvent, 64)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.event = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[len("data: "):]
			case strings.HasPrefix(line, "id: "):
				ev.id = line[len("id: "):]
			case line == "" && ev.event != "":
				out <- ev
				ev = sseEvent{}
			}
		}
	}()
	return out
}

// next is the next event of evs, failing the test after a generous wait.
func next(t *testing.T, evs <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-evs:
		if !ok {
			t.Fatal("the stream ended")
		}
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no event in 30 s")
	}
	return sseEvent{}
}

// The thread's join stream follows its runs one after another, each from
// its first event, even one that began and ended while the stream waited:
// each run's events with ids run_id:n, and Last-Event-ID resumes after
// one, then goes on with the runs created after.
func TestThreadJoinStreamFollowsItsRuns(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		r := p["run"].(map[string]any)
		for _, v := range []string{"first", "second"} {
			if err := stream.Emit(ctx, "values", map[string]any{"run": r["run_id"], "v": v}); err != nil {
				t.Error(err)
			}
		}
		if err := stream.Flush(ctx); err != nil {
			t.Error(err)
		}
		st := map[string]any{"values": map[string]any{}, "next": []any{}, "tasks": []any{}}
		if ans := a.do("PUT", fmt.Sprintf("/v1/agent-server/threads/%s/runs/%s/outcome", r["thread_id"], r["run_id"]),
			map[string]any{"token": token, "status": "success", "state": st}); ans.Status != 200 {
			t.Errorf("outcome: %d %s", ans.Status, ans.Raw)
		}
		return nil
	})
	a.must(501, "GET", "/threads/"+th+"/stream?stream_mode=lifecycle", nil)
	a.hdr.Set("Last-Event-ID", "x")
	a.must(400, "GET", "/threads/"+th+"/stream", nil)
	a.hdr.Del("Last-Event-ID")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := followSSE(ctx, t, a, "/threads/"+th+"/stream", "")
	var runs []string
	for range 2 {
		id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
		a.must(200, "GET", "/threads/"+th+"/runs/"+id+"/join", nil)
		runs = append(runs, id)
	}
	for _, run := range runs {
		for n, v := range []string{"first", "second"} {
			ev := next(t, evs)
			if ev.event != "values" || ev.id != fmt.Sprintf("%s:%d", run, n) || !strings.Contains(ev.data, v) {
				t.Fatalf("event %+v: want %s's values %q, id %s:%d", ev, run, v, run, n)
			}
		}
	}
	cancel()
	rctx, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	resumed := followSSE(rctx, t, a, "/threads/"+th+"/stream", runs[0]+":0")
	for _, want := range []string{runs[0] + ":1", runs[1] + ":0", runs[1] + ":1"} {
		if ev := next(t, resumed); ev.id != want {
			t.Fatalf("resumed after %s:0: event %+v, want id %s", runs[0], ev, want)
		}
	}
}

// A run created while the thread's join stream follows an earlier one is
// followed after it even when etcd compacts its history meanwhile: the
// stream watches for new runs from its start, not from when it needs
// them.
func TestThreadJoinStreamKeepsRunsCreatedBeforeACompaction(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	release := make(chan struct{})
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		r := p["run"].(map[string]any)
		if err := stream.Emit(ctx, "values", map[string]any{"run": r["run_id"]}); err != nil {
			t.Error(err)
		}
		if err := stream.Flush(ctx); err != nil {
			t.Error(err)
		}
		select { // the first run holds until the second is created and the history compacted
		case <-release:
		case <-ctx.Done():
			return nil
		}
		st := map[string]any{"values": map[string]any{}, "next": []any{}, "tasks": []any{}}
		if ans := a.do("PUT", fmt.Sprintf("/v1/agent-server/threads/%s/runs/%s/outcome", r["thread_id"], r["run_id"]),
			map[string]any{"token": token, "status": "success", "state": st}); ans.Status != 200 {
			t.Errorf("outcome: %d %s", ans.Status, ans.Raw)
		}
		return nil
	})
	first := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := followSSE(ctx, t, a, "/threads/"+th+"/stream", "")
	if ev := next(t, evs); ev.id != first+":0" {
		t.Fatalf("event %+v: want %s:0", ev, first)
	}
	second := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "multitask_strategy": "enqueue"}).Obj["run_id"].(string)
	put, err := a.cli.Put(context.Background(), "/compaction-mark-"+th, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.cli.Compact(context.Background(), put.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	close(release)
	for range 10 { // the first run's events left, then the second's first
		ev := next(t, evs)
		if strings.HasPrefix(ev.id, first+":") {
			continue
		}
		if ev.id != second+":0" {
			t.Fatalf("event %+v after the first run's: want %s:0", ev, second)
		}
		return
	}
	t.Fatalf("no event of run %s", second)
}

// Last-Event-ID resumes after an event of a run whose creation etcd has
// compacted away: the runs created after it come from their records, and
// are followed after it.
func TestThreadJoinStreamResumesAcrossACompaction(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		r := p["run"].(map[string]any)
		for range 2 {
			if err := stream.Emit(ctx, "values", map[string]any{"run": r["run_id"]}); err != nil {
				t.Error(err)
			}
		}
		if err := stream.Flush(ctx); err != nil {
			t.Error(err)
		}
		st := map[string]any{"values": map[string]any{}, "next": []any{}, "tasks": []any{}}
		if ans := a.do("PUT", fmt.Sprintf("/v1/agent-server/threads/%s/runs/%s/outcome", r["thread_id"], r["run_id"]),
			map[string]any{"token": token, "status": "success", "state": st}); ans.Status != 200 {
			t.Errorf("outcome: %d %s", ans.Status, ans.Raw)
		}
		return nil
	})
	var runs []string
	for range 2 {
		id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
		a.must(200, "GET", "/threads/"+th+"/runs/"+id+"/join", nil)
		runs = append(runs, id)
	}
	put, err := a.cli.Put(context.Background(), "/compaction-mark-"+th, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.cli.Compact(context.Background(), put.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resumed := followSSE(ctx, t, a, "/threads/"+th+"/stream", runs[0]+":0")
	for _, want := range []string{runs[0] + ":1", runs[1] + ":0", runs[1] + ":1"} {
		if ev := next(t, resumed); ev.id != want {
			t.Fatalf("resumed after %s:0 past a compaction: event %+v, want id %s", runs[0], ev, want)
		}
	}
}
