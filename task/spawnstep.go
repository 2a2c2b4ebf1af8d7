package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Spawning from a step written apart from its run (HTTP agent tasks): the
// same plan, checkpoint and submission as a step that returns Spawn, split
// in two so that the writer can answer between them.

// CommitSpawn is CommitSignal of a step that ends by spawning req's
// children: the children are checked (sp.CheckChildren: their queues
// exist, their fields are valid), their plan is written under fence f,
// and next is checkpointed with the spawn record, all before any child is
// submitted; then AwaitChildren submits them. A step written again after
// a crash writes its own plan over the one of a write that did not commit;
// a plan chunk is written only while the checkpoint is still prev and the
// step has no record, and the checkpoint commits only if every chunk is
// still the one this write put: of two writes of the step under one claim
// (a client's retry while its first write still runs) at most one
// commits, with its own list, and a committed plan is never overwritten. An
// input error names the field ("children[3].queue", "wait") and nothing
// is stored. An empty list spawns nothing: next is committed as it is.
func (s *Store) CommitSpawn(ctx context.Context, f lease.Fence, sp Spawner, prev Checkpoint, next *Checkpoint, rec StepRecord, sg *Signal, req *SpawnRequest) error {
	if len(req.Children) == 0 {
		return s.CommitSignal(ctx, f, prev, next, rec, sg)
	}
	if sp == nil {
		return &drover.InputError{Field: "children", Rule: "this step cannot spawn child tasks: no spawner"}
	}
	r := stepRun{s: s, f: f, id: next.TaskID, cfg: StepConfig{Spawner: sp}}
	rec2, pw, err := r.spawn(ctx, prev, next.Step, req, len(next.State))
	if err != nil {
		return err
	}
	next.Spawn, next.Completed = rec2, false
	return s.commit(ctx, f, prev, next, rec, append(s.consumeOps(next.TaskID, sg, next.At), pw.ops...), pw.cmps...)
}

// AwaitChildren makes sure the children checkpoint cp's step spawned are
// submitted (from its plan, once: a mark written under fence f says so)
// and counts those that ended. Under the default policy (no Collect) a
// child that ended DEAD or CANCELLED is a *ChildFailedError, with the
// counts. For writers of steps apart from their runs (HTTP agent tasks),
// as a queue worker's run does before a parent's next step.
func (s *Store) AwaitChildren(ctx context.Context, f lease.Fence, sp Spawner, cp Checkpoint) (ChildWait, error) {
	r := stepRun{s: s, f: f, id: cp.TaskID, cfg: StepConfig{Spawner: sp}}
	return r.awaitChildren(ctx, cp)
}

// CountChildren counts the children step step of task id spawned: whether
// they were all submitted, how many ended, how many of those ended DEAD or
// CANCELLED (ChildWait's Submitted, Done and Failed; its SpawnRecord is
// left empty). One request.
func (s *Store) CountChildren(ctx context.Context, id string, step int) (ChildWait, error) {
	return s.countChildren(ctx, id, Checkpoint{Step: step, Spawn: &SpawnRecord{}})
}

// planWrite is what writing a step's plan leaves to the transaction of
// the step's checkpoint: writes (the last chunk, the deletion of stale
// chunks) and compares (the chunks written apart are still this write's).
type planWrite struct {
	ops  []clientv3.Op
	cmps []clientv3.Cmp
}

// planPut writes op, a chunk of the plan of step step of task id, under
// fence f and the store guard, and only while the task's checkpoint is
// still prev and step step has no record: a write of the step that lost
// to another cannot touch the plan that committed. It returns the
// revision of the write.
func (s *Store) planPut(ctx context.Context, f lease.Fence, prev Checkpoint, id string, step int, op clientv3.Op) (int64, error) {
	resp, err := f.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(s.keys.TaskCheckpoint(id)), "=", prev.modRev),
			clientv3.Compare(clientv3.Version(s.keys.TaskStep(id, step)), "=", 0),
			storeguard.NotFull(s.keys)).
		Then(op).Else(storeguard.GetOp(s.keys)).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		if err := storeguard.FromRange(resp.Responses[0].GetResponseRange()); err != nil {
			return 0, err
		}
		return 0, ErrConflict
	}
	return resp.Header.Revision, nil
}

// InheritedEnv is environ without the variables that name the files and
// signal of a step (DROVER_*_FILE, DROVER_SIGNAL_NAME): those a process
// got as the command of one step name that step's, and a command it
// starts for another step, or for a task that is not one, must not read
// or write them. The caller appends the new step's own.
//
// It drops the trace context a process inherited too (TRACEPARENT,
// TRACESTATE, BAGGAGE, as OpenTelemetry's environment carriers name
// them): it is the process's own caller's, not the task's, and a command
// run for a task that was not traced must not join that trace. The
// caller appends the task's, when it has one.
func InheritedEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if name == "DROVER_SIGNAL_NAME" || strings.HasPrefix(name, "DROVER_") && strings.HasSuffix(name, "_FILE") ||
			name == "TRACEPARENT" || name == "TRACESTATE" || name == "BAGGAGE" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// ChildOutcome returns how child child (its id) of step step of task id
// ended, its ID set; ok is false while it has not ended (or is no child
// of that step). One read.
func (s *Store) ChildOutcome(ctx context.Context, id string, step int, child string) (o ChildOutcome, ok bool, err error) {
	g, err := s.cli.Get(ctx, s.keys.ChildDone(id, step, child))
	if err != nil {
		return o, false, fmt.Errorf("task %s: read the outcome of child %s: %w", id, child, err)
	}
	if len(g.Kvs) == 0 {
		return o, false, nil
	}
	if err := json.Unmarshal(g.Kvs[0].Value, &o); err != nil {
		return o, false, fmt.Errorf("task %s: the outcome of child %s is unreadable: %w", id, child, err)
	}
	o.ID = child
	return o, true, nil
}

// FailedChild returns the outcome of the first child (in id order) of
// step step of task id that ended DEAD or CANCELLED, its ID set; ok is
// false when none did.
func (s *Store) FailedChild(ctx context.Context, id string, step int) (o ChildOutcome, ok bool, err error) {
	pre := s.keys.ChildFaileds(id, step)
	g, err := s.cli.Get(ctx, pre, clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		return o, false, fmt.Errorf("task %s: read its failed children: %w", id, err)
	}
	if len(g.Kvs) == 0 {
		return o, false, nil
	}
	child := strings.TrimPrefix(string(g.Kvs[0].Key), pre)
	if o, ok, err = s.ChildOutcome(ctx, id, step, child); err != nil || ok {
		return o, ok, err
	}
	return ChildOutcome{ID: child, Status: ChildDead}, true, nil // its outcome is written with its failed mark
}

// ParseChildID splits child, the id of a child of task parent, into the
// step that spawned it and its key; ok is false when no step of parent
// would give a child that id (ChildID).
func ParseChildID(parent, child string) (step int, key string, ok bool) {
	i := strings.LastIndexByte(child, '.')
	if i < 0 {
		return 0, "", false
	}
	j := strings.LastIndexByte(child[:i], '.')
	if j < 0 {
		return 0, "", false
	}
	step, err := strconv.Atoi(child[j+1 : i])
	if err != nil || step < 1 || strconv.Itoa(step) != child[j+1:i] {
		return 0, "", false
	}
	key = child[i+1:]
	return step, key, key != "" && ChildID(parent, step, key) == child
}

// ReadStepFile reads a file an exec step's command wrote to end its step
// (DROVER_SLEEP_FILE, DROVER_WAIT_FILE, DROVER_SPAWN_FILE; env names it
// in errors): nil when it does not exist, an error when it is not a
// regular file (a link, a device: it is not followed) or holds more than
// limit bytes, of which no more than limit+1 are read.
func ReadStepFile(path, env string, limit int64) ([]byte, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s must be a regular file, not %s", env, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s must hold at most %d bytes", env, limit)
	}
	return b, nil
}
