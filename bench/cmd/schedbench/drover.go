package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

const (
	droverQueue    = "schedbench"
	droverSchedule = "tick"
)

// member is one `drover server` of the cluster.
type member struct {
	*child
	client, http string // etcd client URL, HTTP API host:port
	etcd         *clientv3.Client
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startCluster starts a 3-member cluster of `drover server`, each serving
// the HTTP API, and waits until every member knows a leader.
func startCluster(ctx context.Context, c config) ([]*member, error) {
	var ms []*member
	var initial []string
	type ports struct{ client, peer, http string }
	var ps []ports
	for i := range 3 {
		var p ports
		for _, s := range []*string{&p.client, &p.peer, &p.http} {
			a, err := freePort()
			if err != nil {
				return nil, err
			}
			*s = a
		}
		ps = append(ps, p)
		initial = append(initial, fmt.Sprintf("s%d=http://%s", i+1, p.peer))
	}
	for i, p := range ps {
		name := fmt.Sprintf("s%d", i+1)
		ch := newChild(name, c.droverBin, c.workDir, nil, "server", "--name", name, "--initial-cluster", strings.Join(initial, ","),
			"--data-dir", filepath.Join(c.workDir, name), "--etcd-listen", "http://"+p.client, "--etcd-peer-listen", "http://"+p.peer,
			"--http-listen", p.http, "--log-level", "warn")
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.client}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, err
		}
		m := &member{child: ch, client: p.client, http: p.http, etcd: cli}
		if err := ch.start(); err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	for _, m := range ms {
		if err := m.waitReady(ctx); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

// status asks the member alone; its header names it, Leader its leader.
func (m *member) status() (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	return m.etcd.Status(ctx, m.client)
}

// waitReady waits until the member knows a leader and its HTTP API answers.
func (m *member) waitReady(ctx context.Context) error {
	return waitFor(ctx, time.Minute, m.name+" ready", func() bool {
		st, err := m.status()
		if err != nil || st.Leader == 0 {
			return false
		}
		resp, err := http.Get("http://" + m.http + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// leader is the member the live members name as the etcd raft leader.
func leaderOf(ctx context.Context, ms []*member) (*member, error) {
	var found *member
	err := waitFor(ctx, 30*time.Second, "an etcd leader", func() bool {
		for _, m := range ms {
			if !m.alive() {
				continue
			}
			st, err := m.status()
			if err != nil || st.Leader == 0 {
				continue
			}
			for _, o := range ms {
				if o.alive() {
					if ost, err := o.status(); err == nil && ost.Header.MemberId == st.Leader {
						found = o
						return true
					}
				}
			}
		}
		return false
	})
	return found, err
}

// api calls the HTTP API of the first live member that answers.
func api(ms []*member, method, path string, body any, out any) error {
	var last error
	for _, m := range ms {
		if !m.alive() {
			continue
		}
		var rd io.Reader
		if body != nil {
			b, err := json.Marshal(body)
			if err != nil {
				return err
			}
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, "http://"+m.http+path, rd)
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		hc := &http.Client{Timeout: 30 * time.Second}
		resp, err := hc.Do(req)
		if err != nil {
			last = err
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound && strings.Contains(string(b), "no-route") {
			return fmt.Errorf("%s %s: %w", method, path, errNoRoute)
		}
		if resp.StatusCode >= 300 {
			return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
		}
		if out != nil {
			return json.Unmarshal(b, out)
		}
		return nil
	}
	return fmt.Errorf("%s %s: no member answers: %v", method, path, last)
}

type historyEntry struct {
	Nominal   time.Time `json:"nominal_time"`
	Submitted time.Time `json:"submitted_at"`
	TaskID    string    `json:"task_id"`
	Outcome   string    `json:"outcome"`
	Manual    bool      `json:"manual"`
}

// errNoRoute is an HTTP API without the schedules' routes.
var errNoRoute = errors.New("no such route")

// cli runs `drover ARGS --etcd-endpoints LIVE` and decodes its JSON.
func cli(c config, ms []*member, out any, args ...string) error {
	var eps []string
	for _, m := range ms {
		if m.alive() {
			eps = append(eps, m.client)
		}
	}
	cmd := exec.Command(c.droverBin, append(args, "--etcd-endpoints", strings.Join(eps, ","))...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("drover %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// createSchedule creates the schedule over HTTP, or with `drover schedules
// create` where the HTTP API has no schedules yet.
func createSchedule(c config, ms []*member) (string, error) {
	sched := map[string]any{"name": droverSchedule, "every": c.every.String(), "queue": droverQueue, "type": "tick",
		"overlap": "allow", "catchup": c.catchup, "catchup_window": "1h"}
	err := api(ms, "POST", "/v1/schedules", sched, nil)
	if !errors.Is(err, errNoRoute) {
		return "http", err
	}
	return "cli", cli(c, ms, nil, "schedules", "create", droverSchedule, "--every", c.every.String(), "--queue", droverQueue,
		"--type", "tick", "--overlap", "allow", "--catchup", c.catchup, "--catchup-window", "1h", "--json")
}

// history reads the schedule's history (its latest 1000 fires, newest
// first; a page cursor is followed when the answer has one), over HTTP or
// with `drover schedules history`.
func history(c config, ms []*member) ([]historyEntry, error) {
	var page struct {
		Data []historyEntry `json:"data"`
	}
	all, err := historyHTTP(ms)
	if !errors.Is(err, errNoRoute) {
		return all, err
	}
	err = cli(c, ms, &page, "schedules", "history", droverSchedule, "--limit", "1000", "--json")
	return page.Data, err
}

func historyHTTP(ms []*member) ([]historyEntry, error) {
	var all []historyEntry
	after := ""
	for range 1000 {
		var page struct {
			Data []historyEntry `json:"data"`
			Next string         `json:"next"`
		}
		q := url.Values{"limit": {"1000"}}
		if after != "" {
			q.Set("after", after)
		}
		if err := api(ms, "GET", "/v1/schedules/"+droverSchedule+"/history?"+q.Encode(), nil, &page); err != nil {
			return nil, err
		}
		all = append(all, page.Data...)
		if page.Next == "" || page.Next == after {
			return all, nil
		}
		after = page.Next
	}
	return all, fmt.Errorf("history: more than 1000 pages")
}

type queueTask struct {
	ID       string `json:"task_id"`
	Metadata struct {
		CreatedAt time.Time `json:"created_at"`
	} `json:"metadata"`
}

// queueTasks lists every task of the queue, whatever its status.
func queueTasks(ms []*member) (map[string]queueTask, error) {
	all := map[string]queueTask{}
	for _, st := range []string{"SCHEDULED", "PENDING", "RUNNING", "SUCCEEDED", "RETRYING", "DEAD", "CANCELLED"} {
		after := ""
		for i := 0; ; i++ {
			if i == 1000 {
				return nil, fmt.Errorf("tasks %s: more than 1000 pages", st)
			}
			var page struct {
				Tasks []queueTask `json:"tasks"`
				Next  string      `json:"next"`
			}
			q := url.Values{"status": {st}, "limit": {"100"}}
			if after != "" {
				q.Set("after", after)
			}
			if err := api(ms, "GET", "/v1/queues/"+droverQueue+"/tasks?"+q.Encode(), nil, &page); err != nil {
				return nil, err
			}
			for _, t := range page.Tasks {
				all[t.ID] = t
			}
			if page.Next == "" || page.Next == after {
				break
			}
			after = page.Next
		}
	}
	return all, nil
}

// tickOf reads the nominal time out of a tick's task id
// ("tick-20261128T150405Z"), as the schedule derives it.
func tickOf(id string) (time.Time, bool) {
	s, ok := strings.CutPrefix(id, droverSchedule+"-")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse("20060102T150405Z", s)
	return t, err == nil
}

func runDrover(ctx context.Context, c config) (result, error) {
	ms, err := startCluster(ctx, c)
	if err != nil {
		return result{}, err
	}
	defer func() {
		for _, m := range ms {
			m.etcd.Close()
		}
	}()
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.client)
	}
	// The consumer: a drover worker on all three members, whose handler
	// writes each run (task id, attempt, time) to runs.log.
	runs := filepath.Join(c.workDir, "runs.log")
	worker := newChild("worker", c.droverBin, c.workDir, nil, "worker", "--etcd-endpoints", strings.Join(eps, ","),
		"--queue", droverQueue, "--concurrency", "4",
		"--handler", `exec:echo "$DROVER_TASK_ID $DROVER_ATTEMPT $(date +%s%N)" >> `+runs)
	if err := worker.start(); err != nil {
		return result{}, err
	}
	via, err := createSchedule(c, ms)
	if err != nil {
		return result{}, err
	}
	var first time.Time
	if err := waitFor(ctx, time.Minute, "the schedule's first tick", func() bool {
		h, err := history(c, ms)
		for _, e := range h {
			if first.IsZero() || e.Nominal.Before(first) {
				first = e.Nominal
			}
		}
		return err == nil && !first.IsZero()
	}); err != nil {
		return result{}, err
	}
	start := first.Add(c.every)
	workerRestarts := 0
	kills, err := killLoop(ctx, c, start, func() (*child, error) {
		if !worker.alive() && workerRestarts < 100 {
			workerRestarts++ // a worker whose lease was lost exits: run it again
			if err := worker.start(); err != nil {
				return nil, err
			}
		}
		l, err := leaderOf(ctx, ms)
		if err != nil {
			return nil, err
		}
		return l.child, nil
	}, func(ch *child) error {
		if err := ch.start(); err != nil {
			return err
		}
		for _, m := range ms {
			if m.child == ch {
				return m.waitReady(ctx)
			}
		}
		return nil
	})
	if err != nil {
		return result{}, err
	}
	_ = sleepUntil(ctx, time.Now().Add(c.grace))
	r, err := droverResult(c, ms, start, kills, runs)
	if err != nil {
		return result{}, err
	}
	r.Notes["worker_restarts"] = workerRestarts
	r.Notes["schedule_api"] = via
	return r, nil
}

// droverResult counts the ticks from the schedule's history (each fire
// with its nominal time and submit time), adds any tick task in the queue
// that the history does not name (the id carries the nominal time), and
// reads the worker's runs: how late each tick's task first ran, and any
// task run more than once.
func droverResult(c config, ms []*member, start time.Time, kills []kill, runsLog string) (result, error) {
	h, err := history(c, ms)
	if err != nil {
		return result{}, err
	}
	tasks, err := queueTasks(ms)
	if err != nil {
		return result{}, err
	}
	var fires []fire
	outcomes := map[string]int{}
	named := map[string]bool{}
	for _, e := range h {
		outcomes[e.Outcome]++
		if e.Manual || e.TaskID == "" || e.Outcome == "SKIPPED" || strings.HasPrefix(e.Outcome, "REJECTED") {
			continue // no task: not a fire
		}
		named[e.TaskID] = true
		fires = append(fires, fire{id: e.TaskID, nominal: e.Nominal, at: e.Submitted})
	}
	notInHistory := 0
	for id, t := range tasks {
		if n, ok := tickOf(id); ok && !named[id] {
			notInHistory++
			fires = append(fires, fire{id: id, nominal: n, at: t.Metadata.CreatedAt})
		}
	}
	r := summarize("drover", c, start, fires, kills)
	r.Notes["servers"] = 3
	r.Notes["schedule"] = "every " + c.every.String() + ", overlap allow, catchup " + c.catchup + ", window 1h"
	r.Notes["history_entries"] = len(h)
	r.Notes["history_outcomes"] = outcomes
	r.Notes["queue_tasks"] = len(tasks)
	r.Notes["queue_tasks_not_in_history"] = notInHistory
	r.Notes["nominal"] = "the history's nominal_time; lateness is its submitted_at minus it"
	runStats(c, start, runsLog, r.Notes)
	return r, nil
}

// runStats reads the worker's runs.log: tasks of the window run more than
// once, and how late each tick's task first started.
func runStats(c config, start time.Time, path string, notes map[string]any) {
	b, err := os.ReadFile(path)
	if err != nil {
		notes["runs_error"] = err.Error()
		return
	}
	firstRun := map[string]time.Time{}
	count := map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		ns, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			continue
		}
		at := time.Unix(0, ns)
		count[f[0]]++
		if t, ok := firstRun[f[0]]; !ok || at.Before(t) {
			firstRun[f[0]] = at
		}
	}
	var late []float64
	again := 0
	for id, at := range firstRun {
		n, ok := tickOf(id)
		if !ok || n.Before(start) || !n.Before(start.Add(c.duration)) {
			continue
		}
		late = append(late, float64(at.Sub(n))/float64(time.Millisecond))
		if count[id] > 1 {
			again++
		}
	}
	sortFloats(late)
	notes["ticks_run"] = len(late)
	notes["ticks_run_more_than_once"] = again
	notes["run_lateness_p50_ms"] = pct(late, 0.5)
	notes["run_lateness_p99_ms"] = pct(late, 0.99)
	notes["run_lateness_max_ms"] = pct(late, 1)
}
