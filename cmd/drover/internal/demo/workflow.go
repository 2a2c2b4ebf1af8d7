package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"sync"
	"time"

	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The workflow demo's names and defaults.
const (
	// WorkflowTaskID is the research agent's task.
	WorkflowTaskID = "research-1"
	// ResearchQueue holds the research agent; SearchQueue its children.
	ResearchQueue = "research"
	SearchQueue   = "search"
	// ApprovalSignal is the signal the research agent waits for, and
	// ApprovalKey the idempotency key the approver sends it with.
	ApprovalSignal = "approval"
	ApprovalKey    = "review-1"
	// DefaultChildren is how many searches the agent fans out.
	DefaultChildren = 50
	// DefaultWorkflowWorkers is how many worker processes run the demo.
	DefaultWorkflowWorkers = 2
	// DefaultWorkflowTTL is the workers' lease TTL.
	DefaultWorkflowTTL = 2 * time.Second
	// DefaultWorkflowTimeout bounds a whole run.
	DefaultWorkflowTimeout = 60 * time.Second
)

// WorkflowSteps are the research agent's steps.
var WorkflowSteps = []string{"plan", "merge", "act"}

// WorkflowEvent is one line a workflow demo worker prints on stdout.
type WorkflowEvent struct {
	// Kind is "step" (a step of the agent started), "child" (a search
	// ran) or "ready" (the worker is running).
	Kind    string `json:"kind"`
	Worker  string `json:"worker"`
	Task    string `json:"task,omitempty"`
	Step    string `json:"step,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	// Merged is how many child results the merge step read; Signal the
	// idempotency key of the signal the act step received.
	Merged int    `json:"merged,omitempty"`
	Signal string `json:"signal,omitempty"`
	At     int64  `json:"at_unix_ms"`
}

// Finding is a child's result: what one search found.
type Finding struct {
	Topic  string `json:"topic"`
	Source string `json:"source"`
}

// Report is the research agent's result: its findings merged, and who
// approved acting on them.
type Report struct {
	Findings   []Finding `json:"findings"`
	ApprovedBy string    `json:"approved_by"`
	Summary    string    `json:"summary"`
}

// researchSteps are the agent's steps: plan fans out n searches and waits
// for all; merge reads their results and waits for the approval; act
// assembles the report with the approval. emit reports each step's start
// of task id.
func researchSteps(id string, n int, emit func(WorkflowEvent)) []task.Step {
	return []task.Step{
		{Name: "plan", Run: func(ctx context.Context, in []byte) ([]byte, error) {
			emit(WorkflowEvent{Kind: "step", Task: id, Step: "plan"})
			children := make([]task.Child, n)
			for i := range children {
				p, _ := json.Marshal(map[string]string{"topic": fmt.Sprintf("topic-%02d", i+1)})
				children[i] = task.Child{Queue: SearchQueue, Type: "web-search", Parameters: p}
			}
			return []byte(`{"findings":[]}`), task.Spawn(children, task.SpawnOptions{})
		}},
		{Name: "merge", Run: func(ctx context.Context, _ []byte) ([]byte, error) {
			outs, err := task.Children(ctx)
			if err != nil {
				return nil, err
			}
			var r Report
			for _, o := range outs {
				var f Finding
				if o.Status != task.ChildSucceeded || json.Unmarshal(o.Result, &f) != nil {
					return nil, fmt.Errorf("child %s ended %s (%s)", o.ID, o.Status, o.Error)
				}
				r.Findings = append(r.Findings, f)
			}
			emit(WorkflowEvent{Kind: "step", Task: id, Step: "merge", Merged: len(r.Findings)})
			b, err := json.Marshal(r)
			if err != nil {
				return nil, err
			}
			return b, task.WaitSignal(ApprovalSignal, 10*time.Minute)
		}},
		{Name: "act", Run: func(ctx context.Context, state []byte) ([]byte, error) {
			sg, ok := task.ReceivedSignal(ctx)
			emit(WorkflowEvent{Kind: "step", Task: id, Step: "act", Signal: sg.IdempotencyKey})
			if !ok || sg.TimedOut {
				return nil, errors.New("act: no approval came")
			}
			var r Report
			var answer struct {
				Approved bool   `json:"approved"`
				By       string `json:"by"`
			}
			if err := json.Unmarshal(state, &r); err != nil {
				return nil, fmt.Errorf("act: read state: %w", err)
			}
			if err := json.Unmarshal(sg.Data, &answer); err != nil || !answer.Approved {
				r.Summary = "rejected: nothing published"
				return json.Marshal(r)
			}
			r.ApprovedBy = answer.By
			r.Summary = fmt.Sprintf("%d findings merged, approved by %s, published", len(r.Findings), answer.By)
			return json.Marshal(r)
		}},
	}
}

// search is a child's handler: a stand-in for a web search that takes
// 20 to 80 ms (the same for the same topic) and stops when ctx ends.
func search(ctx context.Context, t *queue.Task) ([]byte, error) {
	var p struct {
		Topic string `json:"topic"`
	}
	if err := json.Unmarshal(t.Parameters, &p); err != nil {
		return nil, fmt.Errorf("search: parameters: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(p.Topic))
	tm := time.NewTimer(time.Duration(20+h.Sum32()%60) * time.Millisecond)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	case <-tm.C:
	}
	return json.Marshal(Finding{Topic: p.Topic, Source: "https://example.org/" + p.Topic})
}

// WorkflowWorker runs one worker process of the workflow demo: a worker of
// the research queue (the agent's steps) and one of the search queue (its
// children), printing a WorkflowEvent per step and per child run as a JSON
// line to out, until ctx ends.
func WorkflowWorker(ctx context.Context, cli *clientv3.Client, ns, worker string, children int, ttl time.Duration, out io.Writer) error {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	emit := func(ev WorkflowEvent) {
		ev.Worker, ev.At = worker, time.Now().UnixMilli()
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(ev)
	}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		return err
	}
	base := queue.WorkerConfig{Namespace: ns, WorkerID: worker, TTL: ttl, BackoffBase: 50 * time.Millisecond,
		BackoffMax: 500 * time.Millisecond, ShutdownTimeout: 2 * time.Second}
	rc, sc := base, base
	rc.Queue, rc.Concurrency = ResearchQueue, 2
	sc.Queue, sc.Concurrency = SearchQueue, 16
	rw, err := queue.NewWorker(ctx, cli, rc)
	if err != nil {
		return err
	}
	defer rw.Close(context.WithoutCancel(ctx))
	sw, err := queue.NewWorker(ctx, cli, sc)
	if err != nil {
		return err
	}
	defer sw.Close(context.WithoutCancel(ctx))
	rw.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		return queue.Steps(store, researchSteps(t.ID, children, emit)...)(ctx, t)
	})
	sw.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		emit(WorkflowEvent{Kind: "child", Task: t.ID, Attempt: t.Attempt})
		return search(ctx, t)
	})
	errs := make(chan error, 2)
	go func() { errs <- rw.Run(ctx) }()
	go func() { errs <- sw.Run(ctx) }()
	emit(WorkflowEvent{Kind: "ready"})
	return errors.Join(<-errs, <-errs)
}
