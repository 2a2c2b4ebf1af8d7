package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// attempt is one attempt of a task, as its worker logged it.
type attempt struct {
	id    string
	n     int   // the attempt number drover gave it
	pid   int   // the worker that ran it
	start int64 // Unix ns
	end   int64 // Unix ns when its work was done; 0 if it never was
}

// readAttempts reads the attempts log: "S id n pid ns" when an attempt
// starts, "E id n pid ns" when its work is done. It returns each task's
// attempts in the order they started, and how many lines it could not read.
func readAttempts(path string) (map[string][]*attempt, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	byKey := map[string]*attempt{}
	out := map[string][]*attempt{}
	bad := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 5 || (fs[0] != "S" && fs[0] != "E") {
			bad++
			continue
		}
		n, err1 := strconv.Atoi(fs[2])
		pid, err2 := strconv.Atoi(fs[3])
		ns, err3 := strconv.ParseInt(fs[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			bad++
			continue
		}
		key := fs[1] + " " + fs[2] + " " + fs[3]
		if fs[0] == "S" {
			a := &attempt{id: fs[1], n: n, pid: pid, start: ns}
			byKey[key] = a
			out[a.id] = append(out[a.id], a)
		} else if a := byKey[key]; a != nil {
			a.end = ns
		} else {
			bad++
		}
	}
	for _, as := range out {
		slices.SortFunc(as, func(a, b *attempt) int { return int(a.start - b.start) })
	}
	return out, bad, sc.Err()
}

// ack is an outcome etcd accepted: SUCCEEDED for attempt n of worker pid.
type ack struct {
	n, pid int
	where  string // "segment" (an outcome batch) or "record"
}

// parseResult reads a result "id attempt pid" that the handler printed,
// bare or as a JSON string.
func parseResult(b []byte) (id string, n, pid int, ok bool) {
	fs := strings.Fields(strings.Trim(string(b), `"`))
	if len(fs) != 3 {
		return "", 0, 0, false
	}
	n, err1 := strconv.Atoi(fs[1])
	pid, err2 := strconv.Atoi(fs[2])
	return fs[0], n, pid, err1 == nil && err2 == nil
}

// readAcks reads every success etcd recorded for the queue, from what is
// stored rather than what any process said: each segment's outcome batches
// (a success per slot) and the index of finished tasks with records of
// their own. A task acknowledged twice shows two acks; a done key written
// twice shows as "record" twice too. It reads queue q of client's
// namespace ns.
func readAcks(ctx context.Context, cli *clientv3.Client, client *queue.Client, ns, q string) (map[string][]ack, []string, error) {
	keys := keyspace.MustNew(ns)
	out := map[string][]ack{}
	var problems []string
	outs, err := cli.Get(ctx, keys.Outs(q, ""), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range outs.Kvs {
		o, err := taskstore.DecodeOut(kv.Value)
		if err != nil {
			return nil, nil, fmt.Errorf("outcome batch %s: %w", kv.Key, err)
		}
		for _, s := range o.OK {
			id, n, pid, ok := parseResult(s.Result)
			if !ok || n != s.Attempt {
				problems = append(problems, fmt.Sprintf("%s slot %d: result %q for attempt %d", kv.Key, s.Slot, s.Result, s.Attempt))
				continue
			}
			out[id] = append(out[id], ack{n: n, pid: pid, where: "segment"})
		}
	}
	done, err := cli.Get(ctx, keys.QueueDone(q, string(queue.Succeeded)), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range done.Kvs {
		_, id, ok := keyspace.ParseTimedKey(keys.QueueDone(q, string(queue.Succeeded)), string(kv.Key))
		if !ok {
			continue
		}
		t, err := client.Get(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		_, n, pid, ok := parseResult(t.Result)
		if !ok {
			problems = append(problems, fmt.Sprintf("task %s: result %q", id, t.Result))
			continue
		}
		for range kv.Version {
			out[id] = append(out[id], ack{n: n, pid: pid, where: "record"})
		}
	}
	return out, problems, nil
}

// taskStates lists the queue's tasks by status and returns the status of
// each, with the ids found in more than one status.
func taskStates(ctx context.Context, client *queue.Client) (map[string]queue.Status, []string, error) {
	states := map[string]queue.Status{}
	var twice []string
	for _, st := range []queue.Status{queue.Pending, queue.Running, queue.Retrying, queue.Succeeded, queue.Dead, queue.Cancelled} {
		after := ""
		for range 1000 {
			p, err := client.List(ctx, chaosQueue, st, queue.ListOptions{Limit: queue.MaxListLimit, After: after})
			if err != nil {
				return nil, nil, err
			}
			for _, task := range p.Tasks {
				if prev, ok := states[task.ID]; ok {
					twice = append(twice, fmt.Sprintf("%s (%s and %s)", task.ID, prev, st))
				}
				states[task.ID] = st
			}
			if after = p.Next; after == "" {
				break
			}
		}
	}
	return states, twice, nil
}

// workerCounts reads the counts a worker printed with --json as it
// stopped; ok is false when it printed none (it was killed).
func workerCounts(path string) (queue.WorkerStats, bool) {
	var st queue.WorkerStats
	b, err := os.ReadFile(path)
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return st, false
	}
	return st, json.Unmarshal(b, &st) == nil
}

// statsFromCLI runs drover tasks stats --json.
func (r *queueRun) statsFromCLI() queue.Stats {
	var st queue.Stats
	b := r.drover("tasks", "stats", "--queue", chaosQueue, "--json")
	if err := json.Unmarshal(b, &st); err != nil {
		r.t.Fatalf("drover tasks stats --json: %v: %s", err, b)
	}
	return st
}

// selfExits adds a fault for each worker that ran tasks and ended by
// itself (not killed, paused or stopped by the test). Only a lease lost
// (exit code 70) in a server outage is a fault's consequence; any other
// exit (another code, or 70 with no fault injected) is a test error. Its
// tasks run again, and the report shows which it was.
func (r *queueRun) selfExits(attempts map[string][]*attempt) {
	ran := map[int]bool{}
	for _, as := range attempts {
		for _, a := range as {
			ran[a.pid] = true
		}
	}
	for _, w := range r.all {
		if !w.exited() || !ran[w.pid] || !w.killed.IsZero() || !w.paused.IsZero() || slices.Contains(r.workers, w) {
			continue
		}
		kind := faultSelfExit
		for _, o := range r.outages {
			if w.exitCode() == 70 && !w.ended.Before(o.killed) && w.ended.Before(o.ready.Add(r.cfg.ttl+2*time.Second)) {
				kind = faultOutageExit
			}
		}
		r.faults = append(r.faults, fault{kind: kind, at: w.ended, pids: []int{w.pid}})
		if kind == faultSelfExit {
			r.t.Errorf("worker %d exited by itself (code %d) at %s, not a lost lease (70) in an outage", w.pid, w.exitCode(), w.ended.Format(time.RFC3339Nano))
		}
	}
}

// check reads what the run left and checks it: the counts, every task's
// state, the acks etcd accepted against the attempts the workers logged.
func (r *queueRun) check() *queueReport {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep := &queueReport{cfg: r.cfg, outages: r.outages, stats: r.statsFromCLI()}
	st := rep.stats
	if st.Total() != int64(r.cfg.tasks) || st.Pending+st.Running+st.Retrying != 0 {
		t.Errorf("drover tasks stats: %+v, want %d tasks, all finished", st, r.cfg.tasks)
	}
	states, twice, err := taskStates(ctx, r.client)
	if err != nil {
		t.Fatal(err)
	}
	rep.listed = len(states)
	if len(states) != r.cfg.tasks || len(twice) > 0 {
		t.Errorf("%d tasks listed, want %d; in two states: %v", len(states), r.cfg.tasks, first(twice))
	}
	attempts, bad, err := readAttempts(r.log)
	if err != nil {
		t.Fatal(err)
	}
	rep.badLines = bad
	acks, problems, err := readAcks(ctx, r.cli, r.client, "drover", chaosQueue)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("stored result: %s", p)
	}
	r.selfExits(attempts)
	rep.faults = r.faults
	for _, w := range r.all {
		if c, ok := workerCounts(w.out); ok && !w.paused.IsZero() {
			rep.pausedFenced += int(c.Fenced)
		}
	}
	f := queueFacts{states: states, attempts: attempts, acks: acks, faults: r.faults}
	rep.findings = analyze(f)
	rep.takeovers = takeovers(f, r.cfg.ttl+time.Second)
	rep.fail(t)
	if len(rep.findings.unexplained) > 0 {
		r.describeWorkers(attempts, rep.findings.unexplained)
	}
	return rep
}

// describeWorkers logs what happened to the workers named in problems
// ("... by worker PID ..."), and the attempts of the tasks named first.
func (r *queueRun) describeWorkers(attempts map[string][]*attempt, problems []string) {
	seen := map[string]bool{}
	for _, p := range first(problems) {
		fs := strings.Fields(p)
		id := fs[0]
		for _, a := range attempts[id] {
			r.t.Logf("  %s attempt %d by %d: start %s end %s", id, a.n, a.pid, time.Unix(0, a.start).Format("15:04:05.000"), time.Unix(0, a.end).Format("15:04:05.000"))
		}
		for i, f := range fs {
			if f == "worker" && i+1 < len(fs) && !seen[fs[i+1]] {
				seen[fs[i+1]] = true
				for _, w := range r.all {
					if strconv.Itoa(w.pid) == strings.TrimSuffix(fs[i+1], ",") {
						errs, _ := os.ReadFile(strings.TrimSuffix(w.out, ".out") + ".err")
						r.t.Logf("  worker %d: started %s, exited %t at %s (%v), killed %s, paused %s; stderr: %s", w.pid,
							w.started.Format("15:04:05.000"), w.exited(), w.ended.Format("15:04:05.000"), w.err,
							w.killed.Format("15:04:05.000"), w.paused.Format("15:04:05.000"), errs)
					}
				}
			}
		}
	}
	for _, f := range r.faults {
		r.t.Logf("  fault %s at %s until %s, workers %v", f.kind, f.at.Format("15:04:05.000"), f.until.Format("15:04:05.000"), f.pids)
	}
}

// first returns up to the first 10 of s, for messages.
func first(s []string) []string { return s[:min(len(s), 10)] }
