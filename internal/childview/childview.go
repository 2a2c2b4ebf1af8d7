// Package childview reads a step task's children as its readers show
// them (the HTTP API's task, `drover tasks get`): how many each step
// spawned and how many of them succeeded, failed or have not ended, and one
// page of the children with their states.
//
// A child's entry in its step's plan is its whole task.Child, parameters
// included (up to the plan's 256 KiB chunks), so a read avoids the plans:
// a step's count comes from the checkpoint's task.SpawnRecord for the step
// the task is at, and a page reads only the chunks it lists, one or two
// whatever the fan-out. A read costs the plan's chunk keys (no values),
// the checkpoint, one count-only transaction per 40 steps, the page's
// chunks, and the page's records, 40 a transaction. Only a step before the
// one the task is at, whose record the checkpoint no longer holds, has its
// plan read whole to count its children, once per process (see
// pastCounts).
//
//	p, err := childview.Read(ctx, childview.Source{Etcd: cli, Namespace: ns}, "boss", "", 20)
//	// p.Succeeded, p.Failed, p.Live; p.Children[i].Status; p.Next for the next page
package childview

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Page bounds.
const (
	// DefaultLimit is the page size when none is given (a limit of 0 or
	// less).
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
	Spawned   int64   `json:"spawned"`
	Succeeded int64   `json:"succeeded"`
	Failed    int64   `json:"failed"`
	Live      int64   `json:"live"`
	Steps     []Step  `json:"steps"`
	Children  []Child `json:"children"`
	// Next is the cursor of the next page; "" after the last.
	Next string `json:"next_cursor,omitempty"`
}

// Source is where the children are read: an etcd client and a namespace.
type Source struct {
	Etcd      *clientv3.Client
	Namespace string
}

// Cursor is a place in a task's children: chunk Chunk of step Step's
// plan, from its child Offset on.
type Cursor struct {
	Step, Chunk, Offset int
}

// String is the cursor as Read gives it: "STEP:CHUNK:OFFSET".
func (c Cursor) String() string { return fmt.Sprintf("%d:%d:%d", c.Step, c.Chunk, c.Offset) }

// ParseCursor reads a cursor Read gave (Page.Next); "" is the start. An
// input error naming "cursor" says what is wrong with another.
func ParseCursor(c string) (Cursor, error) {
	if c == "" {
		return Cursor{}, nil
	}
	parts := strings.Split(c, ":")
	var n [3]int
	ok := len(parts) == 3
	for i := 0; ok && i < 3; i++ {
		v, err := strconv.Atoi(parts[i])
		ok = err == nil && v >= 0
		n[i] = v
	}
	if !ok {
		return Cursor{}, &drover.InputError{Field: "cursor", Value: c, Rule: "must be the next cursor of a page of children (STEP:CHUNK:OFFSET)"}
	}
	return Cursor{Step: n[0], Chunk: n[1], Offset: n[2]}, nil
}

// Read returns the children of task parent: every step's counts and up to
// limit children from cursor ("" for the first page). A task that spawned
// none has an empty Page. A cursor that is not one Read gave is an input
// error naming "cursor"; a limit of 0 or less reads DefaultLimit, one over
// MaxLimit reads MaxLimit.
func Read(ctx context.Context, src Source, parent, cursor string, limit int) (Page, error) {
	at, err := ParseCursor(cursor)
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
	l, err := readLayout(ctx, src, keys, parent)
	if err != nil || len(l.steps) == 0 {
		return Page{}, err
	}
	p := Page{Steps: make([]Step, 0, len(l.steps))}
	submitted := map[int]bool{}
	for _, s := range l.steps {
		p.Steps = append(p.Steps, s.Step)
		p.Spawned += int64(s.Spawned)
		p.Succeeded += s.Succeeded
		p.Failed += s.Failed
		p.Live += s.Live
		submitted[s.Step.Step] = s.Submitted
	}
	page, next, err := l.page(ctx, src.Etcd, keys, parent, at, limit)
	if err != nil {
		return Page{}, err
	}
	p.Next = next
	p.Children, err = states(ctx, src, keys, parent, page, submitted)
	return p, err
}

// listed is a child of a page with the step that spawned it.
type listed struct {
	task.Child
	step int
}

// states reads the state of each child of page: its record's status, else
// (its record removed) its outcome's, else NotSubmitted. The records are
// read 40 a transaction, the outcomes of those without one in one
// transaction per outcomeBatch.
func states(ctx context.Context, src Source, keys keyspace.Space, parent string, page []listed, submitted map[int]bool) ([]Child, error) {
	if len(page) == 0 {
		return nil, nil
	}
	qc, err := queue.NewClient(src.Etcd, src.Namespace)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(page))
	for i, ch := range page {
		ids[i] = ch.ID
	}
	tasks, err := qc.GetMany(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("children of %s: read them: %w", parent, err)
	}
	byID := make(map[string]*queue.Task, len(tasks))
	for _, t := range tasks {
		byID[t.ID] = t
	}
	out := make([]Child, len(page))
	var missing []int
	for i, ch := range page {
		out[i] = Child{ID: ch.ID, Queue: ch.Queue, Type: ch.Type, Step: ch.step, Detached: ch.Detached}
		if t, ok := byID[ch.ID]; ok {
			out[i].Status, out[i].Error, out[i].Queue = string(t.CurrentStatus), t.LastError, t.Queue
			continue
		}
		missing = append(missing, i)
	}
	for start := 0; start < len(missing); start += outcomeBatch {
		batch := missing[start:min(start+outcomeBatch, len(missing))]
		ops := make([]clientv3.Op, len(batch))
		for j, i := range batch {
			ops[j] = clientv3.OpGet(keys.ChildDone(parent, page[i].step, page[i].ID))
		}
		resp, err := src.Etcd.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("children of %s: read the outcomes of those without a record: %w", parent, err)
		}
		for j, i := range batch {
			out[i].Status = NotSubmitted
			if kvs := resp.Responses[j].GetResponseRange().Kvs; len(kvs) > 0 {
				var o task.ChildOutcome
				if json.Unmarshal(kvs[0].Value, &o) == nil {
					out[i].Status, out[i].Error = o.Status, o.Error
				}
			} else if submitted[page[i].step] {
				out[i].Status = Removed
			}
		}
	}
	return out, nil
}

// outcomeBatch is how many outcomes one transaction reads (etcd allows 128
// operations a request by default).
const outcomeBatch = 128
