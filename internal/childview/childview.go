// Package childview reads a step task's children as its readers show
// them (the HTTP API's task, `drover tasks get`): how many each step
// spawned and how many of them succeeded, failed or have not ended, and one
// page of the children with their states. However many a step spawned
// (up to task.MaxChildren), a read costs the parent's plans (about 100
// bytes a child), one count-only transaction per 40 steps, and the records
// of one page.
//
//	p, err := childview.Read(ctx, childview.Source{Etcd: cli, Namespace: ns}, "boss", "", 20)
//	// p.Succeeded, p.Failed, p.Live; p.Children[i].Status; p.Next for the next page
package childview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// Page bounds.
const (
	// DefaultLimit is the page size when none is given.
	DefaultLimit = 50
	// MaxLimit is the largest page.
	MaxLimit = 200
)

// NotSubmitted is the status of a child in its step's plan that no one has
// submitted yet (its parent's worker died between the plan and the
// submissions; the next one submits it).
const NotSubmitted = "NOT_SUBMITTED"

// Removed is the status of a child submitted whose record and outcome are
// both gone.
const Removed = "REMOVED"

// Step is what one step spawned and how its children stand.
type Step struct {
	Step int `json:"step"`
	// Spawned counts the children of the step's plan; Submitted says every
	// one of them was submitted.
	Spawned   int  `json:"spawned"`
	Submitted bool `json:"submitted"`
	// Succeeded, Failed (DEAD or CANCELLED) and Live (not ended yet) add
	// up to Spawned.
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	Live      int64 `json:"live"`
}

// Child is one child with its state.
type Child struct {
	ID       string `json:"task_id"`
	Queue    string `json:"queue"`
	Type     string `json:"task_type"`
	Step     int    `json:"step"`
	Status   string `json:"status"`
	Error    string `json:"error,omitempty"`
	Detached bool   `json:"detached,omitempty"`
}

// Page is the children of a task: the counts of every step and a page of
// children in step and plan order.
type Page struct {
	Spawned   int64 `json:"spawned"`
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	Live      int64 `json:"live"`
	Steps     []Step
	Children  []Child
	// Next is the cursor of the next page; "" after the last.
	Next string
}

// Source is where the children are read: an etcd client and a namespace.
type Source struct {
	Etcd      *clientv3.Client
	Namespace string
}

// countBatch is how many steps one count-only transaction takes (three
// operations a step; etcd allows 128 a request by default).
const countBatch = 40

// Read returns the children of task parent: every step's counts and up to
// limit children from cursor ("" for the first page). A task that spawned
// none has an empty Page. A cursor that is not one Read gave is an input
// error naming "cursor"; limit is clamped to [1, MaxLimit].
func Read(ctx context.Context, src Source, parent, cursor string, limit int) (Page, error) {
	startStep, startAt, err := parseCursor(cursor)
	if err != nil {
		return Page{}, err
	}
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	keys, err := keyspace.New(src.Namespace)
	if err != nil {
		return Page{}, err
	}
	store, err := task.NewStore(src.Etcd, src.Namespace)
	if err != nil {
		return Page{}, err
	}
	plans, err := store.Plans(ctx, parent)
	if err != nil || len(plans) == 0 {
		return Page{}, err
	}
	steps := make([]int, 0, len(plans))
	for s := range plans {
		steps = append(steps, s)
	}
	slices.Sort(steps)
	var p Page
	if p.Steps, err = count(ctx, src.Etcd, keys, parent, steps, plans); err != nil {
		return Page{}, err
	}
	for _, s := range p.Steps {
		p.Spawned += int64(s.Spawned)
		p.Succeeded += s.Succeeded
		p.Failed += s.Failed
		p.Live += s.Live
	}
	submitted := map[int]bool{}
	for _, s := range p.Steps {
		submitted[s.Step] = s.Submitted
	}
	var page []task.Child
	var pageSteps []int
	for _, s := range steps {
		if s < startStep {
			continue
		}
		from := 0
		if s == startStep {
			from = startAt
		}
		for i := from; i < len(plans[s]); i++ {
			if len(page) == limit {
				p.Next = fmt.Sprintf("%d:%d", s, i)
				break
			}
			page = append(page, plans[s][i])
			pageSteps = append(pageSteps, s)
		}
		if p.Next != "" {
			break
		}
	}
	p.Children, err = states(ctx, src, keys, parent, page, pageSteps, submitted)
	return p, err
}

// parseCursor reads a cursor: "STEP:INDEX", or "" for the start.
func parseCursor(c string) (step, at int, err error) {
	if c == "" {
		return 0, 0, nil
	}
	a, b, ok := strings.Cut(c, ":")
	step, err1 := strconv.Atoi(a)
	at, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || step < 0 || at < 0 {
		return 0, 0, &drover.InputError{Field: "cursor", Value: c, Rule: "must be the next cursor of a page of children (STEP:INDEX)"}
	}
	return step, at, nil
}

// count reads the counts of every step's children, countBatch steps a
// transaction.
func count(ctx context.Context, cli *clientv3.Client, keys keyspace.Space, parent string, steps []int, plans map[int][]task.Child) ([]Step, error) {
	out := make([]Step, 0, len(steps))
	for start := 0; start < len(steps); start += countBatch {
		batch := steps[start:min(start+countBatch, len(steps))]
		ops := make([]clientv3.Op, 0, 3*len(batch))
		for _, s := range batch {
			ops = append(ops,
				clientv3.OpGet(keys.ChildSubmitted(parent, s), clientv3.WithCountOnly()),
				clientv3.OpGet(keys.ChildDones(parent, s), clientv3.WithPrefix(), clientv3.WithCountOnly()),
				clientv3.OpGet(keys.ChildFaileds(parent, s), clientv3.WithPrefix(), clientv3.WithCountOnly()))
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("children of %s: count them: %w", parent, err)
		}
		for i, s := range batch {
			r := resp.Responses[3*i : 3*i+3]
			done, failed := r[1].GetResponseRange().Count, r[2].GetResponseRange().Count
			n := len(plans[s])
			out = append(out, Step{Step: s, Spawned: n, Submitted: r[0].GetResponseRange().Count > 0,
				Succeeded: done - failed, Failed: failed, Live: max(0, int64(n)-done)})
		}
	}
	return out, nil
}

// states reads the state of each child of page: its record's status, else
// (its record removed) its outcome's, else NotSubmitted.
func states(ctx context.Context, src Source, keys keyspace.Space, parent string, page []task.Child, steps []int, submitted map[int]bool) ([]Child, error) {
	if len(page) == 0 {
		return nil, nil
	}
	qc, err := queue.NewClient(src.Etcd, src.Namespace)
	if err != nil {
		return nil, err
	}
	out := make([]Child, len(page))
	var g errgroup.Group
	g.SetLimit(8)
	for i, ch := range page {
		out[i] = Child{ID: ch.ID, Queue: ch.Queue, Type: ch.Type, Step: steps[i], Detached: ch.Detached}
		g.Go(func() error {
			t, err := qc.Get(ctx, ch.ID)
			switch {
			case err == nil:
				out[i].Status, out[i].Error, out[i].Queue = string(t.CurrentStatus), t.LastError, t.Queue
				return nil
			case !errors.Is(err, queue.ErrNotFound):
				return fmt.Errorf("children of %s: read %s: %w", parent, ch.ID, err)
			}
			g, err := src.Etcd.Get(ctx, keys.ChildDone(parent, steps[i], ch.ID))
			if err != nil {
				return fmt.Errorf("children of %s: read the outcome of %s: %w", parent, ch.ID, err)
			}
			out[i].Status = NotSubmitted
			if len(g.Kvs) > 0 {
				var o task.ChildOutcome
				if json.Unmarshal(g.Kvs[0].Value, &o) == nil {
					out[i].Status, out[i].Error = o.Status, o.Error
				}
			} else if submitted[steps[i]] {
				out[i].Status = Removed
			}
			return nil
		})
	}
	return out, g.Wait()
}
