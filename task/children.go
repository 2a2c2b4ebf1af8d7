package task

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/tracing/otelspan"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limits of child tasks.
const (
	// MaxChildren is the most children one step may spawn.
	MaxChildren = 10000
	// MaxChildResult bounds a child's result as its parent gets it: a
	// child whose result is larger fails (DEAD) instead.
	MaxChildResult = 64 << 10
	// planChunkBytes bounds one chunk of a step's plan, so that a chunk
	// and a checkpoint fit one etcd request together when the state is
	// small.
	planChunkBytes = 256 << 10
)

// Statuses of a child's outcome (a queue task's terminal states).
const (
	ChildSucceeded = "SUCCEEDED"
	ChildDead      = "DEAD"
	ChildCancelled = "CANCELLED"
)

// Child is a task a step spawns (see Spawn): submitted to Queue, which
// must exist (have been submitted to or configured), with its parent
// recorded, so that its terminal outcome comes back to the parent.
type Child struct {
	// ID is set by Spawn: "{parent}.{step}.{key}", where key is Key or
	// the child's 0-based position in the list; a parent id so long that
	// the child's would pass MaxIDLen is cut and given a hash of itself.
	// Any value given is replaced. The same parent step always gives the
	// same ids, so a step run again spawns nothing twice.
	ID string `json:"id"`
	// Key, if set, names the child within its step instead of its
	// position (letters, digits, '_', '-', ':'; no '.', which separates
	// the parts of a child's id).
	Key   string `json:"key,omitempty"`
	Queue string `json:"queue"`
	Type  string `json:"task_type"`
	// Parameters are the child's input, JSON.
	Parameters json.RawMessage `json:"parameters,omitempty"`
	Priority   int             `json:"priority,omitempty"`
	MaxRetries *int            `json:"max_retries,omitempty"`
	Timeout    time.Duration   `json:"timeout,omitempty"`
	// Detached children are not cancelled with their parent.
	Detached bool `json:"detached,omitempty"`
}

// SpawnOptions say what the parent waits for.
type SpawnOptions struct {
	// Wait is how many children must end before the next step runs: 0
	// means all of them (fan-in); N means the first N to end.
	Wait int
	// Collect waits for the outcomes whatever they are. Without it (the
	// default), the first child that ends DEAD or CANCELLED fails the
	// parent (DEAD, not retried) before its next step runs.
	Collect bool
}

// SpawnRequest is what a step returns as its error to spawn children
// (make one with Spawn): the state it returns with it is checkpointed as
// the step's, together with the list of children, before any child is
// submitted; the children are then submitted, and the task waits, holding
// no claim, until the condition of its SpawnOptions holds. Its next step
// then reads their outcomes with Children.
type SpawnRequest struct {
	Children []Child
	Options  SpawnOptions
}

// Spawn ends a step by spawning children: return it as the step's error
// with the step's state (see SpawnRequest). Spawning is idempotent per
// parent step: a step run again after a crash, even one that returns
// another list, spawns only the list its checkpoint recorded. An empty
// list spawns nothing and waits for nothing.
func Spawn(children []Child, opts SpawnOptions) error {
	return &SpawnRequest{Children: children, Options: opts}
}

// Error implements error: a spawn request that reaches a caller which
// cannot spawn reads as what it is.
func (r *SpawnRequest) Error() string {
	return fmt.Sprintf("task: step asks to spawn %d child tasks", len(r.Children))
}

// spawnOf returns the spawn request err is or wraps, if any.
func spawnOf(err error) (*SpawnRequest, bool) {
	var r *SpawnRequest
	ok := errors.As(err, &r)
	return r, ok
}

// SpawnRecord is what a checkpoint says of the children its step spawned.
type SpawnRecord struct {
	// N children, their list in Chunks plan chunks.
	N      int `json:"n"`
	Chunks int `json:"chunks"`
	// Wait: how many must end (N when all); Collect: see SpawnOptions.
	Wait    int  `json:"wait"`
	Collect bool `json:"collect,omitempty"`
}

// Spawner submits the children of step tasks: a queue worker gives one to
// RunSteps (StepConfig.Spawner); without one, a step cannot spawn.
type Spawner interface {
	// CheckChildren returns an error that names the first child that
	// cannot be submitted (its queue does not exist, a field is not
	// valid), before anything is stored.
	CheckChildren(ctx context.Context, children []Child) error
	// SubmitChildren submits the children of step step of task parent,
	// idempotently by their ids.
	SubmitChildren(ctx context.Context, parent string, step int, children []Child) error
}

// ChildFailedError says which child failed its parent under the default
// policy (SpawnOptions.Collect unset).
type ChildFailedError struct {
	Parent, Child string
	Step          int
	Status        string
	Err           string
}

// Error implements error.
func (e *ChildFailedError) Error() string {
	msg := fmt.Sprintf("task %s: child %s (spawned by step %d) ended %s", e.Parent, e.Child, e.Step, e.Status)
	if e.Err != "" {
		msg += ": " + e.Err
	}
	return msg
}

// ChildID is the id of the child of task parent that step step spawned
// with key (its Key, or its position), and "" when even a cut parent id
// leaves no room for it under MaxIDLen.
func ChildID(parent string, step int, key string) string {
	suffix := "." + strconv.Itoa(step) + "." + key
	if len(parent)+len(suffix) <= MaxIDLen {
		return parent + suffix
	}
	sum := sha256.Sum256([]byte(parent))
	tag := "-" + hex.EncodeToString(sum[:8])
	keep := MaxIDLen - len(suffix) - len(tag)
	if keep < 1 {
		return ""
	}
	return parent[:keep] + tag + suffix
}

// planChildren checks a spawn request of step step of task parent and
// returns its children with their ids set.
func planChildren(parent string, step int, req *SpawnRequest) ([]Child, error) {
	n := len(req.Children)
	switch {
	case n > MaxChildren:
		return nil, &drover.InputError{Field: "children", Value: n, Rule: fmt.Sprintf("a step may spawn at most %d children", MaxChildren)}
	case req.Options.Wait < 0 || req.Options.Wait > n:
		return nil, &drover.InputError{Field: "wait", Value: req.Options.Wait, Rule: fmt.Sprintf("must be between 0 (all) and the number of children, %d", n)}
	}
	out := make([]Child, n)
	seen := make(map[string]int, n)
	for i, c := range req.Children {
		key := strconv.Itoa(i)
		if c.Key != "" {
			if err := keyspace.CheckName(fmt.Sprintf("children[%d].key", i), c.Key); err != nil {
				return nil, err
			}
			if strings.Contains(c.Key, ".") {
				// "2.1.0" under step 1 of p would be p.1.2.1.0, the first
				// child of p.1.2's step 1.
				return nil, &drover.InputError{Field: fmt.Sprintf("children[%d].key", i), Value: c.Key, Rule: "must not contain '.': a child's id would be another's grandchild's"}
			}
			key = c.Key
		}
		c.ID = ChildID(parent, step, key)
		if c.ID == "" {
			return nil, &drover.InputError{Field: fmt.Sprintf("children[%d].key", i), Value: c.Key, Rule: fmt.Sprintf("leaves no room for the child's id within %d characters", MaxIDLen)}
		}
		if j, dup := seen[c.ID]; dup {
			return nil, &drover.InputError{Field: fmt.Sprintf("children[%d].key", i), Value: c.Key, Rule: fmt.Sprintf("gives the same id as children[%d]: each child needs its own key", j)}
		}
		seen[c.ID] = i
		if err := keyspace.CheckName(fmt.Sprintf("children[%d].queue", i), c.Queue); err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

// chunkPlan splits children into JSON arrays of at most planChunkBytes
// each (one child larger than that gets a chunk of its own).
func chunkPlan(children []Child) ([][]byte, error) {
	var chunks [][]byte
	var cur []json.RawMessage
	size := 0
	flush := func() error {
		b, err := json.Marshal(cur)
		if err != nil {
			return err
		}
		chunks, cur, size = append(chunks, b), nil, 0
		return nil
	}
	for i := range children {
		b, err := json.Marshal(&children[i])
		if err != nil {
			return nil, fmt.Errorf("children[%d]: %w", i, err)
		}
		if len(cur) > 0 && size+len(b) > planChunkBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		cur, size = append(cur, b), size+len(b)+1
	}
	if len(cur) > 0 {
		if err := flush(); err != nil {
			return nil, err
		}
	}
	return chunks, nil
}

// writePlan writes the plan chunks of step step of task id, fenced by f,
// each only while the task's checkpoint is still prev and step step has
// no record (planPut), all but the last, which it returns with the writes
// that go with it into the checkpoint's transaction (the last chunk is
// written too when it does not fit there): the deletion of the chunks a
// run of the step before may have left beyond it, and compares that the
// chunks written apart are still this write's, so that two writes of the
// step under one claim cannot commit a mix of their lists.
func (s *Store) writePlan(ctx context.Context, f lease.Fence, prev Checkpoint, id string, step int, chunks [][]byte, stateLen int) (planWrite, error) {
	var w planWrite
	put := func(k int) clientv3.Op { return clientv3.OpPut(s.keys.ChildPlanChunk(id, step, k), string(chunks[k])) }
	apart := len(chunks) // written before the checkpoint's transaction
	if last := len(chunks) - 1; stateLen*4/3+len(chunks[last]) <= 900<<10 {
		apart, w.ops = last, append(w.ops, put(last))
	}
	for k := 0; k < apart; k++ {
		rev, err := s.planPut(ctx, f, prev, id, step, put(k))
		if err != nil {
			return w, fmt.Errorf("task %s: write the plan of step %d: %w", id, step, err)
		}
		w.cmps = append(w.cmps, clientv3.Compare(clientv3.ModRevision(s.keys.ChildPlanChunk(id, step, k)), "=", rev))
	}
	w.ops = append(w.ops, clientv3.OpDelete(s.keys.ChildPlanChunk(id, step, len(chunks)), clientv3.WithRange(clientv3.GetPrefixRangeEnd(s.keys.ChildPlan(id, step)))))
	return w, nil
}

// fencedPut writes ops under fence f and the store guard.
func (s *Store) fencedPut(ctx context.Context, f lease.Fence, ops ...clientv3.Op) error {
	resp, err := f.Txn(ctx).If(storeguard.NotFull(s.keys)).Then(ops...).Else(storeguard.GetOp(s.keys)).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		if err := storeguard.FromRange(resp.Responses[0].GetResponseRange()); err != nil {
			return err
		}
		return ErrConflict
	}
	return nil
}

// Plan returns the children step step of task id spawned, from its plan.
func (s *Store) Plan(ctx context.Context, id string, step int) ([]Child, error) {
	g, err := s.cli.Get(ctx, s.keys.ChildPlan(id, step), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("task %s: read the plan of step %d: %w", id, step, err)
	}
	var out []Child
	for _, kv := range g.Kvs {
		var part []Child
		if err := json.Unmarshal(kv.Value, &part); err != nil {
			return nil, fmt.Errorf("task %s: plan chunk %s is unreadable: %w", id, kv.Key, err)
		}
		out = append(out, part...)
	}
	return out, nil
}

// Plans returns every child task id ever spawned, by step, from its
// plans.
func (s *Store) Plans(ctx context.Context, id string) (map[int][]Child, error) {
	g, err := s.cli.Get(ctx, s.keys.ChildPlans(id), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("task %s: read the plans of its children: %w", id, err)
	}
	out := map[int][]Child{}
	for _, kv := range g.Kvs {
		step, _, ok := s.keys.ParseChildPlanChunk(id, string(kv.Key))
		if !ok {
			continue
		}
		var part []Child
		if err := json.Unmarshal(kv.Value, &part); err != nil {
			return nil, fmt.Errorf("task %s: plan chunk %s is unreadable: %w", id, kv.Key, err)
		}
		out[step] = append(out[step], part...)
	}
	return out, nil
}

// ChildWait is what a parent waits for, as its checkpoint and its
// children's outcomes say.
type ChildWait struct {
	Step int
	SpawnRecord
	// Submitted: every child was submitted. Done counts the children that
	// ended, Failed those of them that ended DEAD or CANCELLED.
	Submitted    bool
	Done, Failed int64
	// Since is when the step that spawned them was checkpointed.
	Since time.Time
	// Rev is the store revision the counts were read at.
	Rev int64
}

// ChildrenWait is a wait for children, as a run that stops for it reports
// it (Result.Waiting) and a queue task's record shows it.
type ChildrenWait struct {
	// Step spawned N children; Wait of them must end (see SpawnOptions).
	Step    int  `json:"step"`
	N       int  `json:"n"`
	Wait    int  `json:"wait"`
	Collect bool `json:"collect,omitempty"`
	// Rev is the store revision at which the run counted the children
	// that ended: a child that ends after it makes a park refused.
	Rev int64 `json:"rev"`
}

// Ready reports whether the parent's next step may run (or the parent
// fail): enough children ended, or one failed under the default policy.
func (w ChildWait) Ready() bool {
	return w.Done >= int64(w.Wait) || (!w.Collect && w.Failed > 0)
}

// ChildrenReady reports whether what a task parked on its children waits
// for (cw, as its record shows it) has come: one count-only read.
func (s *Store) ChildrenReady(ctx context.Context, id string, cw ChildrenWait) (bool, error) {
	w, err := s.countChildren(ctx, id, Checkpoint{Step: cw.Step, Spawn: &SpawnRecord{N: cw.N, Wait: cw.Wait, Collect: cw.Collect}})
	return err == nil && w.Ready(), err
}

// countChildren reads the counts of the children checkpoint cp's step
// spawned, in one request.
func (s *Store) countChildren(ctx context.Context, id string, cp Checkpoint) (ChildWait, error) {
	w := ChildWait{Step: cp.Step, SpawnRecord: *cp.Spawn, Since: cp.At}
	c, rev, err := s.CountSteps(ctx, id, []int{cp.Step})
	if err != nil {
		return w, err
	}
	w.Rev, w.Submitted, w.Done, w.Failed = rev, c[0].Submitted, c[0].Done, c[0].Failed
	return w, nil
}

// firstFailed returns the error of a child of step step of task id that
// failed.
func (s *Store) firstFailed(ctx context.Context, id string, step int) error {
	g, err := s.cli.Get(ctx, s.keys.ChildFaileds(id, step), clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("task %s: read its failed children: %w", id, err)
	}
	e := &ChildFailedError{Parent: id, Step: step, Status: "failed"}
	if len(g.Kvs) == 0 {
		return e
	}
	e.Child = keyspace.Rest(s.keys.ChildFaileds(id, step), string(g.Kvs[0].Key))
	d, err := s.cli.Get(ctx, s.keys.ChildDone(id, step, e.Child))
	if err == nil && len(d.Kvs) > 0 {
		var o ChildOutcome
		if json.Unmarshal(d.Kvs[0].Value, &o) == nil {
			e.Status, e.Err = o.Status, o.Error
		}
	}
	return e
}

// spawn records the children step n of the run's task asked for: their
// plan and the step's checkpoint, fenced by the run's fence, nothing
// submitted yet, while the checkpoint is still prev. It returns the
// writes and compares for the checkpoint's commit, and the record (nil
// when there are no children).
func (r *stepRun) spawn(ctx context.Context, prev Checkpoint, n int, req *SpawnRequest, stateLen int) (*SpawnRecord, planWrite, error) {
	var none planWrite
	if len(req.Children) == 0 {
		return nil, none, nil
	}
	if r.cfg.Spawner == nil {
		return nil, none, &drover.InputError{Field: "children", Rule: "only a step task run by a queue worker (queue.Steps) can spawn child tasks"}
	}
	children, err := planChildren(r.id, n, req)
	if err != nil {
		return nil, none, err
	}
	if err := r.cfg.Spawner.CheckChildren(ctx, children); err != nil {
		return nil, none, err
	}
	chunks, err := chunkPlan(children)
	if err != nil {
		return nil, none, err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	pw, err := r.s.writePlan(wctx, r.f, prev, r.id, n, chunks, stateLen)
	if err != nil {
		return nil, none, err
	}
	r.planned, r.plannedStep = children, n
	wait := req.Options.Wait
	if wait == 0 {
		wait = len(children)
	}
	return &SpawnRecord{N: len(children), Chunks: len(chunks), Wait: wait, Collect: req.Options.Collect}, pw, nil
}

// awaitChildren makes sure the children checkpoint cp's step spawned are
// submitted (from its plan, once: a mark under the fence says so), and
// reports whether the next step may run. An error is a
// *ChildFailedError when a child failed its parent.
func (r *stepRun) awaitChildren(ctx context.Context, cp Checkpoint) (ChildWait, error) {
	w, err := r.s.countChildren(ctx, r.id, cp)
	if err != nil {
		return w, err
	}
	if !w.Submitted {
		if r.cfg.Spawner == nil {
			return w, &drover.InputError{Field: "children", Rule: "only a queue worker (queue.Steps) can resume a step task that spawned child tasks"}
		}
		plan := r.planned // written by this run: its checkpoint names it
		if r.plannedStep != cp.Step || plan == nil {
			if plan, err = r.s.Plan(ctx, r.id, cp.Step); err != nil {
				return w, err
			}
		}
		if len(plan) != cp.Spawn.N {
			return w, fmt.Errorf("task %s: the plan of step %d lists %d children, its checkpoint %d", r.id, cp.Step, len(plan), cp.Spawn.N)
		}
		// Submitted to the end even when the claim ends meanwhile (a
		// cancel, a lost lease): the same ids go in whoever submits them,
		// and the spawner must see a cancel through (SubmitChildren).
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		sctx, span := otelspan.StartSpawn(sctx, r.id, cp.Step, len(plan))
		err = r.cfg.Spawner.SubmitChildren(sctx, r.id, cp.Step, plan)
		otelspan.End(span, err)
		cancel()
		if err != nil {
			return w, fmt.Errorf("task %s: submit the children of step %d: %w", r.id, cp.Step, err)
		}
		if err := r.s.fencedPut(ctx, r.f, clientv3.OpPut(r.s.keys.ChildSubmitted(r.id, cp.Step), "")); err != nil {
			return w, fmt.Errorf("task %s: mark the children of step %d submitted: %w", r.id, cp.Step, err)
		}
		if w, err = r.s.countChildren(ctx, r.id, cp); err != nil {
			return w, err
		}
	}
	if !w.Collect && w.Failed > 0 {
		return w, r.s.firstFailed(ctx, r.id, cp.Step)
	}
	return w, nil
}
