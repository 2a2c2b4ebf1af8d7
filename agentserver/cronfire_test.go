package agentserver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestCronFireCrashIsRetried: a fire whose server dies after any number
// of its writes, then claimed again, leaves its run recorded with its
// queue task: never a run that would not run.
func TestCronFireCrashIsRetried(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	id := a.must(200, "POST", "/runs/crons", map[string]any{"assistant_id": "agent", "schedule": "0 0 1 1 *"}).Obj["cron_id"].(string)
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = q.Close(ctx) }()
	lost := 0
	for n := int64(0); n < 12; n++ {
		task := fmt.Sprintf("fire-%d", n)
		if _, err := agentserver.FireCronOn(ctx, crashClient(t, a.cli, n), a.ns, id, task); err != nil {
			lost++
		}
		out, err := agentserver.FireCronOn(ctx, a.cli, a.ns, id, task) // claimed again after the crash
		if err != nil || (out[0] != "created" && out[0] != "exists") {
			t.Fatalf("after a crash at write %d, the fire again: %v, %v", n, out, err)
		}
		a.must(200, "GET", "/threads/"+out[2]+"/runs/"+out[1], nil)
		if _, err := q.Get(ctx, out[1]); err != nil {
			t.Errorf("after a crash at write %d: run %s has no task: %v", n, out[1], err)
		}
	}
	if lost == 0 {
		t.Fatal("no fire crashed: the test crashes nothing")
	}
}

// TestCronCreateCrash: a cron's create whose server dies after any
// number of its writes leaves no schedule without its cron (which would
// fire for nothing), and the next search gives every cron its schedule.
func TestCronCreateCrash(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	sc := schedules(t, a, time.Now)
	for n := int64(0); n < 6; n++ {
		_, _ = agentserver.CreateCronOn(ctx, crashClient(t, a.cli, n), a.ns, "agent", "0 0 1 1 *")
		list, err := sc.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			id := strings.TrimPrefix(s.Name, "agent-cron-")
			if ans := a.do("POST", "/runs/crons/search", map[string]any{"limit": 1000}); !strings.Contains(ans.Raw, id) {
				t.Fatalf("a crash at write %d left schedule %s without its cron", n, s.Name)
			}
		}
	}
	crons := a.must(200, "POST", "/runs/crons/search", map[string]any{"limit": 1000}).List
	list, err := sc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(crons) == 0 || len(list) != len(crons) {
		t.Fatalf("%d crons, %d schedules after a search: want one each", len(crons), len(list))
	}
	for _, c := range crons {
		if c["next_run_date"] == nil {
			t.Errorf("cron %v: no next run date", c["cron_id"])
		}
	}
}

// TestThreadDeleteCrash: a thread's delete whose server dies after any
// number of its writes leaves the thread, or leaves none of its runs'
// tasks to run and none of its crons to fire.
func TestThreadDeleteCrash(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = q.Close(ctx) }()
	for n := int64(0); n < 8; n++ {
		th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
		run := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
		a.must(200, "POST", "/threads/"+th+"/runs/crons", map[string]any{"assistant_id": "agent", "schedule": "0 0 1 1 *"})
		_ = agentserver.DeleteThreadOn(ctx, crashClient(t, a.cli, n), a.ns, th)
		if a.do("GET", "/threads/"+th, nil).Status == 200 { // cut short: sent again, it finishes the job
			if err := agentserver.DeleteThreadOn(ctx, a.cli, a.ns, th); err != nil {
				t.Fatalf("a crash at write %d, the delete again: %v", n, err)
			}
			a.must(404, "GET", "/threads/"+th, nil)
		}
		if task, err := q.Get(ctx, run); err == nil && !task.CurrentStatus.Terminal() {
			t.Errorf("a crash at write %d: the thread is gone, its run's task is %s", n, task.CurrentStatus)
		}
		if c := a.must(200, "POST", "/runs/crons/count", map[string]any{"thread_id": th}); c.Raw != "0" && !strings.HasPrefix(c.Raw, "0\n") {
			t.Errorf("a crash at write %d: the thread is gone, %s of its crons are left", n, c.Raw)
		}
	}
}

// TestCronUpdateClearsEndTime: an update with end_time null clears it;
// one without end_time keeps it.
func TestCronUpdateClearsEndTime(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	c := a.must(200, "POST", "/runs/crons", map[string]any{"assistant_id": "agent", "schedule": "0 0 1 1 *", "end_time": "2099-01-01T00:00:00Z"}).Obj
	id := c["cron_id"].(string)
	if c["end_time"] == nil {
		t.Fatalf("created %v: no end_time", c)
	}
	if got := a.must(200, "PATCH", "/runs/crons/"+id, map[string]any{"enabled": true}).Obj; got["end_time"] == nil {
		t.Fatalf("an update without end_time cleared it: %v", got)
	}
	if got := a.must(200, "PATCH", "/runs/crons/"+id, map[string]any{"end_time": nil}).Obj; got["end_time"] != nil {
		t.Fatalf("an update with end_time null: end_time %v, want null", got["end_time"])
	}
}

// TestCronSweepMakesAMissingSchedule: a server that dies after a cron's
// record, before its schedule, leaves a cron without a schedule; the
// cron runner's sweep makes it, with no search or count of crons.
func TestCronSweepMakesAMissingSchedule(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	sc := schedules(t, a, time.Now)
	_, _ = agentserver.CreateCronOn(ctx, crashClient(t, a.cli, 1), a.ns, "agent", "0 0 1 1 *")
	recs, err := a.cli.Get(ctx, keyspace.MustNew(a.ns).AgentCrons(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	list, err := sc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs.Kvs) != 1 || len(list) != 0 {
		t.Fatalf("after the crash: %d cron records, %d schedules; want the record alone", len(recs.Kvs), len(list))
	}
	id := string(recs.Kvs[0].Key[len(keyspace.MustNew(a.ns).AgentCrons()):])
	cr := &agentserver.CronRunner{Etcd: a.cli, Poll: 20 * time.Millisecond, Sweep: 50 * time.Millisecond}
	cr.Start(ctx)
	defer cr.Stop()
	for i := 0; i < 600 && len(list) == 0; i++ { // 30 s at most
		time.Sleep(50 * time.Millisecond)
		if list, err = sc.List(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(list) != 1 || list[0].Name != "agent-cron-"+id {
		t.Fatalf("schedules after the sweep %v: want the cron's", list)
	}
}
