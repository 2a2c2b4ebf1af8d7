package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// connectEtcd connects the demo's own client to its embedded etcd.
func connectEtcd(ctx context.Context, endpoints []string) (*clientv3.Client, error) {
	return cluster.Connect(ctx, cluster.ClientConfig{Endpoints: endpoints})
}

// verify reads what etcd stored of the run, completes the summary and
// checks every invariant.
func (p *wfPlay) verify(ctx context.Context, cli *clientv3.Client) (WorkflowSummary, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	sum := &p.sum
	for id, n := range p.childRuns {
		if n == 1 {
			sum.ChildrenRunOnce++
		} else {
			sum.ChildrenRunMore = append(sum.ChildrenRunMore, id)
		}
	}
	sort.Strings(sum.ChildrenRunMore)
	t, err := p.qc.Get(rctx, WorkflowTaskID)
	if err != nil {
		return *sum, fmt.Errorf("demo: read %s: %w", WorkflowTaskID, err)
	}
	sum.FinalStatus = string(t.CurrentStatus)
	var r Report
	if t.CurrentStatus == queue.Succeeded && json.Unmarshal(t.Result, &r) == nil {
		sum.Findings, sum.ApprovedBy, sum.Result = len(r.Findings), r.ApprovedBy, r.Summary
	}
	st, err := p.qc.Stats(rctx, SearchQueue)
	if err != nil {
		return *sum, fmt.Errorf("demo: count queue %s: %w", SearchQueue, err)
	}
	sum.ChildrenStored = st.Succeeded
	store, err := task.NewStore(cli, WorkflowNamespace)
	if err != nil {
		return *sum, err
	}
	hist, err := store.History(rctx, WorkflowTaskID)
	if err != nil {
		return *sum, fmt.Errorf("demo: read %s's steps: %w", WorkflowTaskID, err)
	}
	sum.StepRecords = len(hist)
	keys := keyspace.MustNew(WorkflowNamespace)
	in, err := cli.Get(rctx, keys.TaskSignals(WorkflowTaskID), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return *sum, fmt.Errorf("demo: read %s's inbox: %w", WorkflowTaskID, err)
	}
	seen, err := cli.Get(rctx, keys.TaskSignalsSeen(WorkflowTaskID), clientv3.WithPrefix())
	if err != nil {
		return *sum, fmt.Errorf("demo: read %s's consumed signals: %w", WorkflowTaskID, err)
	}
	sum.SignalsLeft, sum.SignalsConsumed = in.Count, seen.Count
	if len(seen.Kvs) > 0 {
		sum.SignalSeenVersion = seen.Kvs[0].Version
	}
	sum.Violations = append(sum.Violations, checkWorkflow(p.cfg, *sum, r)...)
	sum.InvariantsMet = len(sum.Violations) == 0
	if !sum.InvariantsMet {
		return *sum, fmt.Errorf("%w: %s", ErrInvariant, strings.Join(sum.Violations, "; "))
	}
	return *sum, nil
}

// checkWorkflow returns every invariant of the workflow demo the run broke.
func checkWorkflow(cfg WorkflowConfig, s WorkflowSummary, r Report) []string {
	var v []string
	add := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	// The kill comes once every search ended: none was in flight, so none
	// may run twice.
	if s.ChildrenRunOnce != cfg.Children || len(s.ChildrenRunMore) != 0 || s.ChildRuns != cfg.Children {
		add("%d searches ran once and %d more often (%d runs); want each of the %d once", s.ChildrenRunOnce, len(s.ChildrenRunMore), s.ChildRuns, cfg.Children)
	}
	if s.ChildrenStored != int64(cfg.Children) {
		add("etcd holds %d searches SUCCEEDED, want %d", s.ChildrenStored, cfg.Children)
	}
	for _, step := range WorkflowSteps {
		if s.StepRuns[step] != 1 {
			add("step %s ran %d times, want once", step, s.StepRuns[step])
		}
	}
	if s.StepRecords != len(WorkflowSteps) {
		add("%d step records, want %d", s.StepRecords, len(WorkflowSteps))
	}
	if s.KilledWorker == "" || !s.KillConfirmed || s.StatusAfterKill != string(queue.Waiting) {
		add("no worker was killed while the task waited (killed %q, SIGKILL confirmed %t, the task then %q)", s.KilledWorker, s.KillConfirmed, s.StatusAfterKill)
	}
	if s.RunningAfterKill != 0 || len(s.HeldAfterKill) != 0 {
		add("after the kill %d tasks RUNNING in %s and keys claimed or leased %v; want 0 and none", s.RunningAfterKill, ResearchQueue, s.HeldAfterKill)
	}
	if !s.SignalWoke || s.SignalRetryStored || s.SignalRetry == "" {
		add("the approval woke the task: %t, its retry stored another: %t (%q); want true, false", s.SignalWoke, s.SignalRetryStored, s.SignalRetry)
	}
	if s.SignalsConsumed != 1 || s.SignalsLeft != 0 || s.SignalSeenVersion != 1 {
		add("%d signals consumed (tombstone version %d) and %d left in the inbox, want 1 (version 1: written once) and 0", s.SignalsConsumed, s.SignalSeenVersion, s.SignalsLeft)
	}
	if s.ParentResumes != 1 || s.ResumedBy == "" || s.ResumedBy == s.KilledWorker {
		add("the agent resumed %d times after the approval, by %q (killed: %q); want once, by another worker", s.ParentResumes, s.ResumedBy, s.KilledWorker)
	}
	topics := map[string]bool{}
	for _, f := range r.Findings {
		topics[f.Topic] = true
	}
	if s.FinalStatus != string(queue.Succeeded) || s.Findings != cfg.Children || len(topics) != cfg.Children || s.ApprovedBy != "ana" {
		add("final %s with %d findings (%d topics), approved by %q; want SUCCEEDED, %d distinct, ana", s.FinalStatus, s.Findings, len(topics), s.ApprovedBy, cfg.Children)
	}
	return v
}
