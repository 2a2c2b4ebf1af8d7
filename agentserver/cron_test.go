package agentserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// schedules is a schedule client of a's namespace with clock now.
func schedules(t *testing.T, a *api, now func() time.Time) *schedule.Client {
	t.Helper()
	c, err := schedule.New(schedule.Config{Etcd: a.cli, Namespace: a.ns, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fires are the results of the fire tasks of a's namespace.
func fires(t *testing.T, a *api) []map[string]any {
	t.Helper()
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = q.Close(context.Background()) }()
	var out []map[string]any
	for _, st := range []queue.Status{queue.Succeeded, queue.Pending, queue.Running} {
		page, err := q.List(context.Background(), agentserver.CronsQueue, st, queue.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range page.Tasks {
			m := map[string]any{"task": task.ID, "status": string(task.CurrentStatus)}
			_ = json.Unmarshal(task.Result, &m)
			out = append(out, m)
		}
	}
	return out
}

// TestCronFiresARunPerTick: a thread's cron, fired by the schedule runner
// (its clock a minute ahead, so a tick is due at once) and the cron
// runner, makes one run with the cron's input, config and metadata; the
// ticks that come while that run is active make none (reject, as
// LangGraph); a fire attempted again finds its run; a deleted cron fires
// no more, and a fire in flight makes nothing.
func TestCronFiresARunPerTick(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	c := a.must(200, "POST", "/threads/"+th+"/runs/crons", map[string]any{"assistant_id": "agent", "schedule": "* * * * *",
		"input": map[string]any{"n": 1}, "config": map[string]any{"configurable": map[string]any{"k": "v"}}, "metadata": map[string]any{"m": 1}}).Obj
	id, _ := c["cron_id"].(string)
	if len(id) != 36 || c["thread_id"] != th || c["enabled"] != true || c["next_run_date"] == nil || fmt.Sprint(c["payload"].(map[string]any)["input"]) != "map[n:1]" {
		t.Fatalf("created %v: want an enabled cron of the thread with its next run date and payload", c)
	}
	ahead := func() time.Time { return time.Now().Add(61 * time.Second) }
	sr := &schedule.Runner{Client: schedules(t, a, ahead)}
	cr := &agentserver.CronRunner{Etcd: a.cli, Poll: 20 * time.Millisecond}
	sr.Start(ctx)
	cr.Start(ctx)
	var runs []map[string]any
	for i := 0; i < 400 && len(runs) == 0; i++ {
		time.Sleep(50 * time.Millisecond)
		runs = a.must(200, "GET", "/threads/"+th+"/runs", nil).List
	}
	sr.Stop()
	cr.Stop()
	if len(runs) != 1 {
		t.Fatalf("runs %v: want the fire's one", runs)
	}
	kw := runs[0]["kwargs"].(map[string]any)
	md := runs[0]["metadata"].(map[string]any)
	if fmt.Sprint(kw["input"]) != "map[n:1]" || fmt.Sprint(kw["config"]) != "map[configurable:map[k:v]]" || md["cron_id"] != id || md["m"] != float64(1) {
		t.Fatalf("run %v: want the cron's input, config and metadata", runs[0])
	}
	var created string
	for _, f := range fires(t, a) {
		switch f["outcome"] {
		case "created":
			if created != "" || f["run_id"] != runs[0]["run_id"] {
				t.Fatalf("fires %v: want one that created run %v", fires(t, a), runs[0]["run_id"])
			}
			created = f["task"].(string)
		case "skipped":
			if !strings.Contains(fmt.Sprint(f["why"]), "reject") {
				t.Fatalf("fire %v: want skipped as the thread's run rejects it", f)
			}
		default:
			t.Fatalf("fire %v: want created or skipped", f)
		}
	}
	if created == "" {
		t.Fatalf("fires %v: none created the run", fires(t, a))
	}
	if out, run, err := agentserver.FireCron(ctx, a.cli, a.ns, id, created); err != nil || out != "exists" || run != runs[0]["run_id"] {
		t.Fatalf("the fire again: %s %s (%v); want the run it made", out, run, err)
	}

	a.must(204, "DELETE", "/runs/crons/"+id, nil)
	a.must(404, "DELETE", "/runs/crons/"+id, nil)
	if _, err := schedules(t, a, nil).Get(ctx, "agent-cron-"+id); !errors.Is(err, schedule.ErrNotFound) {
		t.Fatalf("the deleted cron's schedule: %v; want it gone", err)
	}
	if out, _, err := agentserver.FireCron(ctx, a.cli, a.ns, id, "in-flight"); err != nil || out != "gone" {
		t.Fatalf("a fire of the deleted cron: %s (%v); want gone", out, err)
	}
	if n := len(a.must(200, "GET", "/threads/"+th+"/runs", nil).List); n != 1 {
		t.Fatalf("%d runs after the cron's delete, want 1", n)
	}
}

// TestCronWithoutThread: an assistant's cron makes each fire's run on a
// thread of its own, the same for a fire attempted again.
func TestCronWithoutThread(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	c := a.must(200, "POST", "/runs/crons", map[string]any{"assistant_id": "agent", "schedule": "0 9 * * MON-FRI", "timezone": "Europe/Paris", "input": "hi"}).Obj
	id := c["cron_id"].(string)
	if c["thread_id"] != nil || c["on_run_completed"] != "keep" || c["timezone"] != "Europe/Paris" {
		t.Fatalf("created %v: want no thread, on_run_completed keep, its timezone", c)
	}
	// Nothing would delete each fire's thread: delete is refused, nothing stored.
	a.must(501, "POST", "/runs/crons", map[string]any{"assistant_id": "agent", "schedule": "* * * * *", "on_run_completed": "delete"})
	if n := a.must(200, "POST", "/runs/crons/count", map[string]any{}); strings.TrimSpace(n.Raw) != "1" {
		t.Fatalf("crons counted %v after a refused one: want 1", n.Raw)
	}
	out, run, err := agentserver.FireCron(ctx, a.cli, a.ns, id, "tick-1")
	if err != nil || out != "created" {
		t.Fatalf("fire: %s (%v)", out, err)
	}
	again, run2, err := agentserver.FireCron(ctx, a.cli, a.ns, id, "tick-1")
	if err != nil || again != "exists" || run2 != run {
		t.Fatalf("the fire again: %s %s (%v); want its run %s", again, run2, err, run)
	}
	other, run3, err := agentserver.FireCron(ctx, a.cli, a.ns, id, "tick-2")
	if err != nil || other != "created" || run3 == run {
		t.Fatalf("the next tick: %s %s (%v); want a run of its own", other, run3, err)
	}
	threads := a.must(200, "POST", "/threads/search", map[string]any{"metadata": map[string]any{"cron_id": id}}).List
	if len(threads) != 2 {
		t.Fatalf("threads %v: want one per fire", threads)
	}
}

// TestCronSearchUpdateCount: crons are searched and counted by assistant,
// thread and metadata; an update changes the schedule, disables it (no
// next run date) or is refused whole; deleting a thread deletes its crons.
func TestCronSearchUpdateCount(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	tc := a.must(200, "POST", "/threads/"+th+"/runs/crons", map[string]any{"assistant_id": "agent", "schedule": "*/5 * * * *", "metadata": map[string]any{"team": "a"}}).Obj
	a.must(200, "POST", "/runs/crons", map[string]any{"assistant_id": "agent", "schedule": "@hourly", "metadata": map[string]any{"team": "b"}})
	count := func(f map[string]any) string {
		return strings.TrimSpace(a.must(200, "POST", "/runs/crons/count", f).Raw)
	}
	if n, m, all := count(map[string]any{"thread_id": th}), count(map[string]any{"metadata": map[string]any{"team": "b"}}), count(map[string]any{"assistant_id": "agent"}); n != "1" || m != "1" || all != "2" {
		t.Fatalf("counts by thread %s, metadata %s, assistant %s: want 1, 1, 2", n, m, all)
	}
	found := a.must(200, "POST", "/runs/crons/search", map[string]any{"thread_id": th, "select": []any{"cron_id", "schedule"}}).List
	if len(found) != 1 || found[0]["schedule"] != "*/5 * * * *" || len(found[0]) != 2 {
		t.Fatalf("search %v: want the thread's cron, its selected fields", found)
	}
	id := tc["cron_id"].(string)
	up := a.must(200, "PATCH", "/runs/crons/"+id, map[string]any{"schedule": "0 * * * *", "enabled": false, "input": map[string]any{"x": 1}}).Obj
	if up["schedule"] != "0 * * * *" || up["enabled"] != false || up["next_run_date"] != nil || fmt.Sprint(up["payload"].(map[string]any)["input"]) != "map[x:1]" {
		t.Fatalf("update %v: want the new schedule, disabled, no next run date, the new input", up)
	}
	if s, err := schedules(t, a, nil).Get(context.Background(), "agent-cron-"+id); err != nil || !s.Paused || s.Cron != "0 * * * *" {
		t.Fatalf("schedule %+v (%v): want paused at the new expression", s, err)
	}
	if ans := a.must(400, "PATCH", "/runs/crons/"+id, map[string]any{"schedule": "0 25 * * *"}); !errorAt(ans, "body.schedule") || !strings.Contains(ans.Raw, "field 2 (hour)") {
		t.Fatalf("bad update: %s; want a problem naming body.schedule and the field", ans.Raw)
	}
	if got := a.must(200, "POST", "/runs/crons/search", map[string]any{"thread_id": th}).List[0]; got["schedule"] != "0 * * * *" {
		t.Fatalf("after a refused update %v: want it unchanged", got)
	}
	a.must(204, "DELETE", "/threads/"+th, nil)
	if n := count(map[string]any{}); n != "1" {
		t.Fatalf("%s crons after the thread's delete, want the assistant's 1", n)
	}
}

// TestCronBadInput: a schedule that does not parse (named by its field and
// position), an unknown time zone, assistant or thread, or an option not
// served is a problem, and stores neither a cron nor a schedule.
func TestCronBadInput(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	missing := "00000000-0000-4000-8000-000000000000"
	ok := map[string]any{"assistant_id": "agent", "schedule": "* * * * *"}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for kk, vv := range ok {
			m[kk] = vv
		}
		m[k] = v
		return m
	}
	for _, c := range []struct {
		name, path string
		body       map[string]any
		status     int
		location   string
		says       string
	}{
		{"minute out of range", "/threads/" + th + "/runs/crons", with("schedule", "61 * * * *"), 400, "body.schedule", "field 1 (minute)"},
		{"four fields", "/runs/crons", with("schedule", "* * * *"), 400, "body.schedule", "five fields"},
		{"day of week", "/runs/crons", with("schedule", "0 9 * * FUNDAY"), 400, "body.schedule", "field 5 (day-of-week)"},
		{"no schedule", "/runs/crons", with("schedule", ""), 400, "body.schedule", ""},
		{"time zone", "/runs/crons", with("timezone", "Mars/Olympus"), 400, "body.timezone", ""},
		{"unknown assistant", "/runs/crons", with("assistant_id", "nograph"), 404, "body.assistant_id", "No assistant found"},
		{"unknown thread", "/threads/" + missing + "/runs/crons", ok, 404, "", "Thread with ID " + missing + " not found"},
		{"thread not a UUID", "/threads/x/runs/crons", ok, 400, "path.thread_id", ""},
		{"strategy not served", "/runs/crons", with("multitask_strategy", "enqueue"), 501, "body.multitask_strategy", ""},
		{"webhook", "/runs/crons", with("webhook", "http://127.0.0.1:1/x"), 501, "body.webhook", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ans := a.must(c.status, "POST", c.path, c.body)
			if ans.Header.Get("Content-Type") != "application/problem+json" || (c.location != "" && !errorAt(ans, c.location)) || !strings.Contains(ans.Raw, c.says) {
				t.Fatalf("%d %s: want a problem naming %s saying %q", c.status, ans.Raw, c.location, c.says)
			}
		})
	}
	a.must(400, "DELETE", "/runs/crons/x", nil)
	a.must(404, "PATCH", "/runs/crons/"+missing, map[string]any{"enabled": false})
	if n := strings.TrimSpace(a.must(200, "POST", "/runs/crons/count", map[string]any{}).Raw); n != "0" {
		t.Fatalf("after bad inputs, %s crons are stored; want 0", n)
	}
	if list, err := schedules(t, a, nil).List(context.Background()); err != nil || len(list) != 0 {
		t.Fatalf("after bad inputs, schedules %v (%v); want none", list, err)
	}
}

// TestCronWorkerRestarts: a namespace whose worker could not be made
// (etcd did not answer) gets one at a later poll.
func TestCronWorkerRestarts(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	a.must(200, "POST", "/threads/"+th+"/runs/crons", map[string]any{"assistant_id": "agent", "schedule": "0 0 1 1 *"})
	var mu sync.Mutex
	tries := 0
	cr := &agentserver.CronRunner{Etcd: a.cli, Poll: 10 * time.Millisecond}
	agentserver.SetNewWorker(cr, func(ctx context.Context, cli *clientv3.Client, cfg queue.WorkerConfig) (*queue.Worker, error) {
		if cfg.Namespace != a.ns {
			return nil, errors.New("not this test's namespace")
		}
		mu.Lock()
		tries++
		n := tries
		mu.Unlock()
		if n == 1 {
			return nil, errors.New("etcd did not answer")
		}
		return queue.NewWorker(ctx, cli, cfg)
	})
	cr.Start(ctx)
	n := 0
	for i := 0; i < 500 && n < 2; i++ {
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
		n = tries
		mu.Unlock()
	}
	time.Sleep(50 * time.Millisecond) // polls that must not start another
	cr.Stop()
	mu.Lock()
	defer mu.Unlock()
	if tries != 2 {
		t.Fatalf("workers made %d times: want 2, the failed one and the one that ran", tries)
	}
}
