package cli_test

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

func TestSchedulesCommands(t *testing.T) {
	ns := etcdtest.Namespace(t)
	run := func(args ...string) result {
		t.Helper()
		return drover(t, append(append([]string{"schedules"}, args...), etcdFlags(ns)...)...)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "a", "--cron", "0 25 * * *", "--queue", "q", "--type", "t"}, "field 2 (hour)"},
		{[]string{"create", "a", "--cron", "0 9 * * *", "--tz", "Mars/Base", "--queue", "q", "--type", "t"}, "invalid --tz"},
		{[]string{"create", "a", "--every", "500ms", "--queue", "q", "--type", "t"}, "invalid --every"},
		{[]string{"create", "a", "--every", "1s", "--queue", "bad/q", "--type", "t"}, "invalid --queue"},
		{[]string{"create", "a", "--every", "1s", "--queue", "q", "--type", "t", "--overlap", "never"}, "invalid --overlap"},
		{[]string{"create", "a", "--every", "1s", "--queue", "q", "--type", "t", "--catchup-window", "-1s"}, "invalid --catchup-window"},
		{[]string{"history", "a", "--limit", "0"}, "invalid --limit"},
	} {
		if r := run(tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if r := run("list", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != `{"data":[]}` {
		t.Fatalf("bad input stored something: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r := run("create", "digest", "--cron", "0 9 * * MON-FRI", "--tz", "Europe/Paris", "--queue", "mail", "--type", "digest",
		"--params", `{"to":"team"}`, "--jitter", "5s", "--json")
	var s map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &s) != nil || s["tz"] != "Europe/Paris" || s["overlap"] != "skip" ||
		s["catchup"] != "latest" || s["catchup_window"] != "1h0m0s" || s["next_fire_at"] == nil {
		t.Fatalf("create: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("create", "digest", "--every", "1m", "--queue", "mail", "--type", "digest"); r.code != 2 || !strings.Contains(r.stderr, "already exists") {
		t.Fatalf("create twice: %d %q", r.code, r.stderr)
	}
	if r := run("update", "digest", "--every", "1h", "--tz", "Asia/Tokyo"); r.code != 2 || !strings.Contains(r.stderr, "invalid --tz") {
		t.Fatalf("update --every with --tz: %d %q, want it refused", r.code, r.stderr)
	}
	if r := run("update", "digest", "--every", "1h", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"every":"1h0m0s"`) || strings.Contains(r.stdout, `"cron"`) {
		t.Fatalf("update: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("pause", "digest", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"paused":true`) {
		t.Fatalf("pause: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("trigger", "digest", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"task_id":"digest-manual-`) {
		t.Fatalf("trigger: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("trigger", "digest"); r.code != 0 || !strings.HasPrefix(r.stdout, "schedule digest fired: task digest-manual-") {
		t.Fatalf("trigger: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = run("history", "digest", "--json")
	var h struct{ Data []schedule.Fire }
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &h) != nil || len(h.Data) != 2 || h.Data[0].Outcome != "PENDING" {
		t.Fatalf("history: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("history", "digest"); r.code != 0 || !strings.HasPrefix(r.stdout, "NOMINAL") || strings.Count(r.stdout, "digest-manual-") != 2 {
		t.Fatalf("history: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("resume", "digest"); r.code != 0 || !strings.Contains(r.stdout, "paused false") {
		t.Fatalf("resume: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("list"); r.code != 0 || !strings.Contains(r.stdout, "every 1h0m0s") {
		t.Fatalf("list: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("delete", "digest"); r.code != 0 || strings.TrimSpace(r.stdout) != "schedule digest deleted" {
		t.Fatalf("delete: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("get", "digest"); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("get after delete: %d %q", r.code, r.stderr)
	}
	if r := drover(t, "schedules", "create", "--help"); r.code != 0 || !strings.Contains(r.stdout, "--cron") || !strings.Contains(r.stdout, "Examples:") {
		t.Fatalf("help: %d %q", r.code, r.stdout)
	}
}

// startScheduler starts a drover server that fires ns's schedules.
func startScheduler(t *testing.T, ns string, env ...string) *process {
	t.Helper()
	return start(t, cleanEnv(env...), append(etcdFlags(ns), "server", "--store-guard=false")...)
}

// fires reads schedule name's history, oldest first.
func fires(t *testing.T, c *schedule.Client, name string) []schedule.Fire {
	t.Helper()
	h, err := c.History(context.Background(), name, schedule.MaxHistory)
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(h, func(i, j int) bool { return h[i].NominalTime.Before(h[j].NominalTime) })
	return h
}

// TestScheduleFiresOnceAcrossKills runs every-1s schedules on three
// servers, two of which kill themselves between a submission and its
// move, then the third is killed, and two start again after a gap: each
// tick made one task, none was missed (catch-up all), and catch-up latest
// fired one of the ticks missed in the gap.
func TestScheduleFiresOnceAcrossKills(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	c, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, cu := range []schedule.Catchup{schedule.All, schedule.Latest} {
		if _, err := c.Create(ctx, schedule.Schedule{Name: string(cu), Every: queue.Duration(time.Second), Queue: "ticks",
			Type: "tick", Overlap: schedule.Allow, Catchup: cu}); err != nil {
			t.Fatal(err)
		}
	}
	a := startScheduler(t, ns, schedule.EnvCrashAfterSubmit+"=3")
	b := startScheduler(t, ns, schedule.EnvCrashAfterSubmit+"=7")
	cc := startScheduler(t, ns)
	for _, p := range []*process{a, b} {
		if code := p.wait(t, 90*time.Second); code != 128+int(syscall.SIGKILL) {
			t.Fatalf("a server with the crash hook exit %d: %s", code, p.stderr.String())
		}
	}
	waitFor(t, 60*time.Second, "ten fires after the kills", func() bool { return len(fires(t, c, "all")) >= 10 })
	_ = cc.cmd.Process.Signal(syscall.SIGKILL)
	cc.wait(t, 10*time.Second)
	before := fires(t, c, "latest")
	lastBefore := before[len(before)-1].NominalTime
	time.Sleep(3 * time.Second) // a gap of ticks while no server runs
	restart := time.Now()
	again := []*process{startScheduler(t, ns), startScheduler(t, ns)}
	waitFor(t, 60*time.Second, "fires after the restart", func() bool {
		h := fires(t, c, "all")
		return h[len(h)-1].NominalTime.After(restart.Add(2 * time.Second))
	})
	for _, p := range again { // nothing fires while the tasks are counted
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		p.wait(t, 10*time.Second)
	}
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	page, err := qc.List(ctx, "ticks", queue.Pending, queue.ListOptions{Limit: queue.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	tasks := map[string]bool{}
	for _, task := range page.Tasks {
		tasks[task.ID] = true
	}
	all := fires(t, c, "all")
	for i, f := range all {
		if i > 0 && f.NominalTime.Sub(all[i-1].NominalTime) != time.Second {
			t.Fatalf("catch-up all: fires %v then %v: a tick missed or fired twice", all[i-1].NominalTime, f.NominalTime)
		}
		if f.TaskID != schedule.TaskID("all", f.NominalTime) || !tasks[f.TaskID] {
			t.Fatalf("fire %+v: its task is not in the queue", f)
		}
	}
	var latest []schedule.Fire // its fires; the ticks it passed over have MISSED records
	for _, f := range fires(t, c, "latest") {
		if f.Outcome != "MISSED" {
			latest = append(latest, f)
		}
	}
	inGap := 0
	for i, f := range latest {
		if i > 0 && !f.NominalTime.After(latest[i-1].NominalTime) {
			t.Fatalf("catch-up latest: tick %v twice", f.NominalTime)
		}
		// The tick after lastBefore may be one whose task the killed
		// server submitted: the first server up records it.
		if f.NominalTime.After(lastBefore.Add(time.Second)) && !f.NominalTime.After(restart) {
			inGap++
		}
	}
	if inGap > 1 {
		t.Fatalf("catch-up latest fired %d ticks of the gap, want at most 1", inGap)
	}
	// Every task is a fire's, but for the tick after each schedule's last
	// fire: its server was killed between its submission and its move.
	recorded := map[string]bool{}
	for _, h := range [][]schedule.Fire{all, latest} {
		for _, f := range h {
			recorded[f.TaskID] = true
		}
		last := h[len(h)-1]
		name := strings.TrimSuffix(last.TaskID, last.NominalTime.Format("-20060102T150405Z"))
		recorded[schedule.TaskID(name, last.NominalTime.Add(time.Second))] = true
	}
	for id := range tasks {
		if !recorded[id] {
			t.Fatalf("task %s is no fire's", id)
		}
	}
	if len(tasks) < len(all)+len(latest) {
		t.Fatalf("%d tasks for %d + %d fires", len(tasks), len(all), len(latest))
	}
	t.Logf("catch-up all: %d ticks, each once; latest: %d fires", len(all), len(latest))
}

// TestScheduleResubmitsAfterCrashMidFire: a server killed between a tick's
// submission and its move leaves the task without its history record; the
// next server submits the same id again (stored once) and records the
// tick, so the tick has one task and one record.
func TestScheduleResubmitsAfterCrashMidFire(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	c, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Create(ctx, schedule.Schedule{Name: "s", Every: queue.Duration(time.Second), Queue: "mid", Type: "t",
		Overlap: schedule.Allow, Catchup: schedule.All}); err != nil {
		t.Fatal(err)
	}
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	pending := func() []*queue.Task {
		page, err := qc.List(ctx, "mid", queue.Pending, queue.ListOptions{Limit: queue.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		return page.Tasks
	}
	a := startScheduler(t, ns, schedule.EnvCrashAfterSubmit+"=1")
	if code := a.wait(t, 60*time.Second); code != 128+int(syscall.SIGKILL) {
		t.Fatalf("the server with the crash hook exit %d: %s", code, a.stderr.String())
	}
	tasks := pending()
	if len(tasks) != 1 || len(fires(t, c, "s")) != 0 {
		t.Fatalf("after the crash: %d tasks, %d fires; want the first tick's task and no record", len(tasks), len(fires(t, c, "s")))
	}
	orphan := tasks[0].ID
	b := startScheduler(t, ns)
	waitFor(t, 60*time.Second, "three fires", func() bool { return len(fires(t, c, "s")) >= 3 })
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	b.wait(t, 20*time.Second)
	h := fires(t, c, "s")
	if h[0].TaskID != orphan {
		t.Fatalf("the first record is %s, want the crashed fire's task %s", h[0].TaskID, orphan)
	}
	ids := map[string]bool{}
	for _, task := range pending() {
		ids[task.ID] = true
	}
	for _, f := range h {
		if !ids[f.TaskID] {
			t.Fatalf("fire %+v has no task", f)
		}
	}
	if len(ids) > len(h)+1 {
		t.Fatalf("%d tasks for %d fires", len(ids), len(h))
	}
}
