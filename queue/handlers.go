package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/droverhq/drover/internal/proc"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ExitPermanent is the exit code (EX_DATAERR) with which an exec handler's
// command says its failure is permanent.
const ExitPermanent = 65

// DefaultMaxOutput bounds an exec handler's result.
const DefaultMaxOutput = MaxResult

// ExecHandler returns a handler that runs argv in a process of its own for
// each task, so that tasks are isolated from each other and from the
// worker: the task as JSON on standard
// input, its standard output (at most maxOutput bytes; 0 means
// DefaultMaxOutput) as the result. Exit 0 is success; exit 65 (EX_DATAERR) a
// permanent failure; any other exit, a signal, or a timeout a transient one.
// More output than maxOutput is a permanent failure, and the excess is
// discarded as it arrives, so no amount of output can exhaust memory. When
// the task's context ends (timeout, cancellation, lost claim), the process
// group gets SIGTERM, then SIGKILL after grace. The command gets
// DROVER_TASK_ID, DROVER_TASK_TYPE, DROVER_ATTEMPT and DROVER_CLAIM_TOKEN in
// its environment; its standard error goes to stderr, and the last 2 KiB of
// it to the task's error.
func ExecHandler(argv []string, maxOutput int, grace time.Duration, stderr *os.File) Handler {
	if maxOutput <= 0 {
		maxOutput = DefaultMaxOutput
	}
	if grace <= 0 {
		grace = 5 * time.Second
	}
	return func(ctx context.Context, t *Task) ([]byte, error) {
		in, err := json.Marshal(t)
		if err != nil {
			return nil, Permanent(fmt.Errorf("encode task: %w", err))
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "DROVER_TASK_ID="+t.ID, "DROVER_TASK_TYPE="+t.Type,
			"DROVER_ATTEMPT="+strconv.Itoa(t.Attempt), "DROVER_CLAIM_TOKEN="+strconv.FormatInt(t.Token, 10))
		cmd.Stdin = bytes.NewReader(in)
		out := &boundedBuffer{limit: maxOutput}
		tail := &tailBuffer{limit: 2048}
		cmd.Stdout = out
		if stderr != nil {
			cmd.Stderr = multiWriter{stderr, tail}
		} else {
			cmd.Stderr = tail
		}
		waitErr, stopped, startErr := proc.Supervise(cmd, nil, ctx.Done(), grace, nil)
		switch {
		case startErr != nil:
			return nil, Permanent(fmt.Errorf("start %s: %w", argv[0], startErr))
		case stopped:
			return nil, fmt.Errorf("%s stopped: %w", argv[0], context.Cause(ctx))
		case out.over:
			return nil, Permanent(fmt.Errorf("%s printed %d bytes, over the %d-byte result limit", argv[0], out.total, maxOutput))
		case waitErr == nil:
			return out.Bytes(), nil
		}
		var ee *exec.ExitError
		msg := waitErr.Error()
		if s := bytes.TrimSpace(tail.Bytes()); len(s) > 0 {
			msg += ": " + string(s)
		}
		if errors.As(waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && !ws.Signaled() && ws.ExitStatus() == ExitPermanent {
				return nil, Permanent(fmt.Errorf("%s: %s", argv[0], msg))
			}
		}
		return nil, fmt.Errorf("%s: %s", argv[0], msg)
	}
}

// boundedBuffer keeps the first limit bytes written and counts the rest. It
// has no ReadFrom on purpose: io.Copy would use bytes.Buffer's, which reads
// everything into memory.
type boundedBuffer struct {
	buf   []byte
	limit int
	total int
	over  bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.total += len(p)
	if room := b.limit - len(b.buf); room < len(p) {
		b.over = true
		if room > 0 {
			b.buf = append(b.buf, p[:room]...)
		}
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Bytes returns what was kept.
func (b *boundedBuffer) Bytes() []byte { return b.buf }

// tailBuffer keeps the last limit bytes written.
type tailBuffer struct {
	buf   []byte
	limit int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.limit {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.limit:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) Bytes() []byte { return b.buf }

type multiWriter struct {
	a *os.File
	b *tailBuffer
}

func (m multiWriter) Write(p []byte) (int, error) {
	_, _ = m.a.Write(p)
	return m.b.Write(p)
}

type claimKey struct{}

// claimFence is a running task's claim as a fence for writes made while
// handling it (see Steps).
type claimFence struct {
	w      *Worker
	c      *claim
	cancel context.CancelCauseFunc // ends the handler's context
	ctx    context.Context         // the claim's: ends with a cancel, the lease, or the attempt
}

var _ lease.Fence = (*claimFence)(nil)

// Txn starts a transaction that commits only while the claim is held.
func (f *claimFence) Txn(ctx context.Context) clientv3.Txn {
	var also []clientv3.Cmp
	if f.c.run != nil { // a task of a run: not cancelled (its slot has no exit)
		also = append(also, clientv3.Compare(clientv3.CreateRevision(f.w.keys.Exit(f.w.cfg.Queue, f.c.run.seg, f.c.slot)), "=", 0))
	}
	return lease.NewFencedTxn(ctx, f.w.cli, lease.Spec{
		Name:  fmt.Sprintf("claim of task %s", f.c.task.ID),
		Token: f.c.token,
		Cmp:   clientv3.Compare(clientv3.CreateRevision(f.c.claimKey), "=", f.c.token),
		Also:  also,
		Check: f.Err,
		Lost:  func(cause error) { f.cancel(fmt.Errorf("%w: claim lost: %w", lock.ErrLost, cause)) },
	})
}

// Token is the claim's fencing token.
func (f *claimFence) Token() int64 { return f.c.token }

// Context is cancelled when the claim ends: the task was cancelled, the
// worker's lease was lost, a write under the claim was refused, or the
// attempt is over.
func (f *claimFence) Context() context.Context { return f.ctx }

// Err reports the worker's lease loss, which ends every claim, and the end
// of the claim's context.
func (f *claimFence) Err() error {
	if err := f.w.lease.Err(); err != nil {
		return err
	}
	if f.ctx.Err() != nil {
		return context.Cause(f.ctx)
	}
	return nil
}

// ClaimFence returns the claim of the task a handler runs, as a lease.Fence:
// writes made with its Txn commit only while the claim is held, and its
// Context ends when the claim does. It is nil outside a handler.
func ClaimFence(ctx context.Context) lease.Fence {
	if f, ok := ctx.Value(claimKey{}).(*claimFence); ok {
		return f
	}
	return nil
}

// Steps returns a handler that runs each task as agent steps, with the task
// runner's checkpoints (see package task): the first step gets the task's
// parameters, every step's checkpoint is written fenced by the task's claim,
// and an attempt that follows one that died (a worker killed, a claim lost)
// resumes after the last checkpointed step instead of starting over. The
// result is the last step's state. A step's error fails the attempt (and is
// retried like any handler error).
func Steps(store *task.Store, steps ...task.Step) Handler {
	return func(ctx context.Context, t *Task) ([]byte, error) {
		f, ok := ctx.Value(claimKey{}).(*claimFence)
		if !ok {
			return nil, Permanent(errors.New("queue.Steps handler run outside a worker"))
		}
		res, err := store.RunSteps(ctx, f, t.ID, steps, task.StepConfig{Worker: f.w.worker, Initial: t.Parameters})
		if err != nil {
			var tl *task.StateTooLargeError
			if errors.As(err, &tl) || errors.Is(err, task.ErrStepsChanged) {
				return nil, Permanent(err)
			}
			return nil, err
		}
		return res.State, nil
	}
}
