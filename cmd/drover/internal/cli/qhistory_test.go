package cli_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/qstats"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

func TestQueuesHistory(t *testing.T) {
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	// The recorder a server runs, closing the minute when the test says.
	rec, err := qstats.NewRecorder(qstats.Config{Client: cli, Namespace: ns, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	rec.Start(ctx)
	defer rec.Stop(ctx)
	<-rec.Ready()
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, "hq", []queue.Task{{ID: "a", Type: "x"}, {ID: "b", Type: "x"}, {ID: "c", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "hq", Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	w.Handle("x", func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(30*time.Second, func() bool { return rec.Unclosed("hq") == qstats.Counts{Processed: 3, Started: 3} }) {
		t.Fatalf("counted %+v", rec.Unclosed("hq"))
	}
	if closed, err := rec.CloseMinute(ctx, time.Now()); !closed || err != nil {
		t.Fatalf("close: %v %v", closed, err)
	}
	r := drover(t, append(etcdFlags(ns), "queues", "history", "hq", "--json")...)
	var h struct {
		Totals struct {
			Processed int64 `json:"processed"`
		} `json:"totals"`
		Buckets []json.RawMessage `json:"buckets"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &h) != nil || h.Totals.Processed != 3 || len(h.Buckets) != 60 {
		t.Fatalf("history --json: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "queues", "history", "hq", "--window", "24h")...)
	if r.code != 0 || !strings.Contains(r.stdout, "processed 3, failed 0") || !strings.Contains(r.stdout, "the last day") {
		t.Fatalf("history: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	for _, tc := range []struct {
		args []string
		code int
		say  string
	}{
		{[]string{"queues", "history", "hq", "--window", "2h"}, 2, "--window"},
		{[]string{"queues", "history", "bad/q"}, 2, "Q"},
		{[]string{"queues", "history", "nope"}, 1, "does not exist"},
	} {
		r := drover(t, append(etcdFlags(ns), tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.say) {
			t.Errorf("%v: exit %d %q, want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.say)
		}
	}
	if r := drover(t, "queues", "history", "--help"); r.code != 0 || !strings.Contains(r.stdout, "drover queues history emails") {
		t.Errorf("--help: %q", r.stdout)
	}
}

// A real server keeps the history in its embedded etcd: after a SIGKILL
// and a restart on the same data dir it shows the same minutes, and goes
// on counting. Minutes close on the clock here: the test waits for them.
func TestQueuesHistorySurvivesServerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for minutes to close on the clock")
	}
	dataDir := filepath.Join(t.TempDir(), "data")
	client := "http://" + etcdtest.FreeAddr()
	args := []string{"server", "--data-dir", dataDir, "--etcd-listen", client, "--etcd-peer-listen", "http://" + etcdtest.FreeAddr(),
		"--http-listen", etcdtest.FreeAddr()}
	flags := []string{"--etcd-endpoints", client}
	ready := func(p *process) {
		t.Helper()
		waitFor(t, 30*time.Second, "the ready line", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
	}
	type history struct {
		ClosedThrough string `json:"closed_through"`
		Totals        struct {
			Processed int64 `json:"processed"`
		} `json:"totals"`
	}
	read := func() history {
		t.Helper()
		r := drover(t, append(flags, "queues", "history", "hq", "--json")...)
		var h history
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &h) != nil {
			t.Fatalf("history: exit %d %q %q", r.code, r.stdout, r.stderr)
		}
		return h
	}
	work := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if r := drover(t, append(flags, "submit", "--queue", "hq", "--type", "x", "--id", id)...); r.code != 0 {
				t.Fatalf("submit: %d %s", r.code, r.stderr)
			}
		}
		if r := drover(t, append(flags, "worker", "--queue", "hq", "--handler", "noop", "--drain")...); r.code != 0 {
			t.Fatalf("worker: %d %s", r.code, r.stderr)
		}
	}
	p := start(t, cleanEnv(), args...)
	ready(p)
	work("a", "b", "c")
	waitFor(t, 100*time.Second, "a minute closed with 3 processed", func() bool { time.Sleep(time.Second); return read().Totals.Processed == 3 })
	before := read()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 20*time.Second)
	p = start(t, cleanEnv(), args...)
	ready(p)
	if after := read(); after != before {
		t.Fatalf("after a restart: %+v, before: %+v", after, before)
	}
	work("d", "e")
	waitFor(t, 100*time.Second, "the restarted server counted 2 more", func() bool { time.Sleep(time.Second); return read().Totals.Processed == 5 })
}

// Each command's example shows that command: queues history's example
// belongs to queues and queues history, not to queues delete.
func TestQueuesHistoryExampleNotUnderDelete(t *testing.T) {
	r := drover(t, "queues", "delete", "--help")
	if r.code != 0 || strings.Contains(r.stdout, "queues history") || !strings.Contains(r.stdout, "drover queues delete old-emails --yes") {
		t.Errorf("drover queues delete --help: exit %d:\n%s", r.code, r.stdout)
	}
}
