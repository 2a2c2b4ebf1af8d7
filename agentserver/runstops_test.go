package agentserver_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const stopsPath = "/v1/agent-server/runs/stops"

// nextStop is the next event of a stop stream, which must be a stop:
// its task id.
func nextStop(t *testing.T, evs <-chan sseEvent) string {
	t.Helper()
	ev := next(t, evs)
	var s agentserver.RunStop
	if ev.event != "stop" || json.Unmarshal([]byte(ev.data), &s) != nil || s.TaskID == "" || s.RunID != s.TaskID || s.Revision < 1 {
		t.Fatalf("event %+v: want a stop", ev)
	}
	return s.TaskID
}

// nextReady is the next event of a stop stream, which must be ready with
// resumed as given: its revision, which is its SSE id.
func nextReady(t *testing.T, evs <-chan sseEvent, resumed bool) string {
	t.Helper()
	ev := next(t, evs)
	var r agentserver.RunStopsReady
	if ev.event != "ready" || json.Unmarshal([]byte(ev.data), &r) != nil || r.Resumed != resumed || ev.id != strconv.FormatInt(r.Revision, 10) {
		t.Fatalf("event %+v: want ready, resumed %v, its id its revision", ev, resumed)
	}
	return ev.id
}

// cancel cancels run id of thread th.
func cancelRun(a *api, th, id, action string) {
	a.t.Helper()
	if ans := a.do("POST", "/threads/"+th+"/runs/"+id+"/cancel?action="+action, nil); ans.Status >= 300 {
		a.t.Fatalf("cancel %s: %d %s", id, ans.Status, ans.Raw)
	}
}

// A cancel, a new run's interrupt and a new run's rollback each reach the
// stream as a stop of the run stopped, and the runs that stopped them
// (which end as they should) are no stops: the next stop after them is a
// cancel's.
func TestRunStopsTellEachStop(t *testing.T) {
	a := newAPI(t)
	f := newFakeRuntime(t, a, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := followSSE(ctx, t, a, stopsPath, "")
	nextReady(t, evs, false)

	th := newThread(t, a)
	cancelled := createRun(a, th, "reject")
	<-f.started
	cancelRun(a, th, cancelled, "interrupt")
	if got := nextStop(t, evs); got != cancelled {
		t.Fatalf("stop of %s, want the cancelled run %s", got, cancelled)
	}
	for _, strategy := range []string{"interrupt", "rollback"} {
		th := newThread(t, a)
		first := createRun(a, th, "reject")
		<-f.started
		second := createRun(a, th, strategy)
		if got := nextStop(t, evs); got != first {
			t.Fatalf("%s: stop of %s, want the first run %s", strategy, got, first)
		}
		if got := <-f.started; got != second {
			t.Fatalf("%s: started %s, want %s", strategy, got, second)
		}
		f.release(second)
		if st := joined(a, th, second); st != "success" {
			t.Fatalf("%s: the new run %s", strategy, st)
		}
	}
	lastTh := newThread(t, a)
	last := createRun(a, lastTh, "reject")
	<-f.started
	cancelRun(a, lastTh, last, "rollback")
	if got := nextStop(t, evs); got != last {
		t.Fatalf("stop of %s, want the run cancelled last %s (the runs that ended were no stops)", got, last)
	}
}

// A stop before the stream opens is in the stream's snapshot (the stops
// of the last minute), before ready; a stream reopened with the id of an
// earlier ready gets the stops after it, and those only.
func TestRunStopsSeenWhenStoppedBeforeTheStream(t *testing.T) {
	a := newAPI(t)
	f := newFakeRuntime(t, a, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := followSSE(ctx, t, a, stopsPath, "")
	before := nextReady(t, first, false)
	cancel()

	th := newThread(t, a)
	run := createRun(a, th, "reject")
	<-f.started
	cancelRun(a, th, run, "interrupt")

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	fresh := followSSE(ctx, t, a, stopsPath, "")
	if got := nextStop(t, fresh); got != run {
		t.Fatalf("snapshot stop of %s, want %s", got, run)
	}
	after := nextReady(t, fresh, false)

	resumed := followSSE(ctx, t, a, stopsPath, before)
	if id := nextReady(t, resumed, true); id != before {
		t.Fatalf("resumed ready %s, want %s", id, before)
	}
	if got := nextStop(t, resumed); got != run {
		t.Fatalf("resumed stop of %s, want %s", got, run)
	}

	later := followSSE(ctx, t, a, stopsPath, after)
	nextReady(t, later, true)
	th2 := newThread(t, a)
	run2 := createRun(a, th2, "reject")
	<-f.started
	cancelRun(a, th2, run2, "interrupt")
	if got := nextStop(t, later); got != run2 {
		t.Fatalf("stop of %s after ready %s, want %s alone", got, after, run2)
	}
}

// The stream ends when its client goes; an id etcd compacted away is a
// 410, one that is no revision a 400.
func TestRunStopsEndWithTheClient(t *testing.T) {
	a := newAPI(t)
	waitOpen := func(n int64) {
		t.Helper()
		for i := 0; agentserver.RunStopsOpen() != n; i++ {
			if i > 1000 {
				t.Fatalf("%d stop streams open, want %d", agentserver.RunStopsOpen(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitOpen(0)
	ctx, cancel := context.WithCancel(context.Background())
	evs := followSSE(ctx, t, a, stopsPath+"?keepalive=1", "")
	rev := nextReady(t, evs, false)
	waitOpen(1)
	cancel()
	waitOpen(0)

	put, err := a.cli.Put(context.Background(), "/compaction-mark-"+a.ns, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.cli.Compact(context.Background(), put.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int{rev: 410, "x": 400, "0": 400, strconv.FormatInt(put.Header.Revision+1_000_000, 10): 400} {
		a.hdr.Set("Last-Event-ID", id)
		a.must(want, "GET", stopsPath, nil)
	}
	a.hdr.Del("Last-Event-ID")
	a.must(400, "GET", stopsPath+"?keepalive=0", nil)
}
