package queue

import (
	"context"
	"slices"

	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// compares hold while claim c is held: its key (the task's claim, or
// its run) has c's token as create revision, and, for a task of a run,
// its slot has not left the segment.
func (w *Worker) compares(c *claim) []clientv3.Cmp {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.claimKey), "=", c.token)}
	if c.run != nil {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(w.keys.Exit(w.cfg.Queue, c.run.seg, c.slot)), "=", 0))
	}
	return cmps
}

// Compares are the compares of the claim's fence: a stream.Fence, so
// that a task's stream is written under its claim in transactions
// shared with other streams.
func (f *claimFence) Compares() []clientv3.Cmp { return f.w.compares(f.c) }

var _ stream.Fence = (*claimFence)(nil)

// beginStream starts the attempt of claim f at its task's stream: the
// handler's stream.Emit writes there. A retry, or a step resumed after a
// sleep, may follow events of an attempt before.
func (w *Worker) beginStream(ctx context.Context, f *claimFence) (context.Context, *stream.Attempt) {
	t := f.c.task
	resumed := slices.ContainsFunc(t.Transitions, func(tr Transition) bool { return tr.Status == Sleeping })
	return stream.Begin(ctx, w.cli, w.keys, stream.Claim{Task: t.ID, Attempt: t.Attempt, Worker: w.worker, Fence: f}, t.Attempt > 1 || resumed)
}

// endStream closes the attempt's events with its outcome, under its
// claim, before the outcome is written: Done when the task ended,
// AttemptEnded otherwise. A claim already lost writes nothing (the next
// attempt marks the boundary).
func (w *Worker) endStream(ctx context.Context, at *stream.Attempt, o outcome) {
	typ, name := stream.AttemptEnded, ""
	switch o.kind {
	case Succeeded:
		typ, name = stream.Done, "succeeded"
	case Dead:
		typ, name = stream.Done, "dead"
	case Cancelled:
		if o.err != nil {
			return // the claim or the lease is gone
		}
		typ, name = stream.Done, "cancelled"
	case Retrying:
		name = "retrying"
	case Sleeping:
		name = "sleeping"
	default:
		name = "handed back"
	}
	if err := at.End(ctx, typ, name, o.err); err != nil {
		w.logger.Debug("queue: the end of an attempt was not written to its stream", "task", o.c.task.ID, "err", err)
	}
}

// StreamClaim returns the claim h names as the writer of its task's
// stream (an external worker's emits, which its token proves). An error
// matching lease.ErrFenced says the claim no longer holds;
// ErrNotFound, that queue h.Queue has no task h.ID.
func (c *Client) StreamClaim(ctx context.Context, h Held) (stream.Claim, error) {
	if err := h.check(); err != nil {
		return stream.Claim{}, err
	}
	w, cl, _, err := c.remote.held(ctx, h)
	if err != nil {
		return stream.Claim{}, err
	}
	return stream.Claim{Task: h.ID, Attempt: cl.task.Attempt, Worker: w.worker, Fence: heldFence{token: h.Token, cmps: w.compares(cl)}}, nil
}

// heldFence is an external worker's claim as the writer of a stream.
type heldFence struct {
	token int64
	cmps  []clientv3.Cmp
}

func (f heldFence) Token() int64             { return f.token }
func (f heldFence) Compares() []clientv3.Cmp { return f.cmps }
func (f heldFence) Err() error               { return nil }
