package checkpoint

import (
	"context"
	"fmt"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxTxnBytes bounds the values one transaction of PutWithWrites carries:
// etcd refuses a request past --max-request-bytes (1.5 MiB by default,
// which drover keeps), and the keys, compares and framing take some of
// it. A fenced transaction carries its values once too (lease.NewTokenTxn
// guards one copy of them), so the bound is the same with a fence or
// without. A checkpoint and its parent's writes larger together (the
// writes being all the parent's, those stored before included, once a
// refusal or the new writes' own size had them read) go in two
// transactions, as separate Put and PutWrites calls do.
//
// The number of operations is no limit here (etcd's --max-txn-ops, 128):
// a checkpoint's pending writes are one key whatever their number, so the
// transaction has the same few compares and operations for any writes.
const maxTxnBytes = 3<<19 - 64<<10

// PutWithWrites is PutWrites of parentWrites for cp's parent (cp.ParentID)
// and Put of cp, in one etcd transaction: both are stored or neither. The
// checks and errors are theirs: the parent must exist (an error matching
// ErrNotFound), the writes are merged as PutWrites merges them, cp is
// written only if its parent is the head (a *ConflictError), and a fence
// fences both. Without writes it is Put.
//
// When the checkpoint and the parent's writes are too large together for
// one etcd request, the writes are saved first and then the checkpoint,
// in two transactions: a checkpoint refused then keeps the writes saved.
// The parent's stored writes are read before the first try only when the
// new ones are that large alone; otherwise the first try assumes none are
// stored, and a put refused then (a missing parent, a moved head) stores
// nothing, even where the stored writes would have made it two
// transactions.
func (s *Etcd) PutWithWrites(ctx context.Context, cp Checkpoint, parentWrites []Write, fence Fence) (Checkpoint, error) {
	return s.putWithWrites(ctx, cp, parentWrites, fence, true)
}

// AppendWithWrites is PutWithWrites with Append's put: cp becomes the head
// whatever the head is.
func (s *Etcd) AppendWithWrites(ctx context.Context, cp Checkpoint, parentWrites []Write, fence Fence) (Checkpoint, error) {
	return s.putWithWrites(ctx, cp, parentWrites, fence, false)
}

// putWithWrites saves writes for cp's parent and puts cp (if cas, only on
// the head), in one transaction when they fit in one.
func (s *Etcd) putWithWrites(ctx context.Context, cp Checkpoint, writes []Write, fence Fence, cas bool) (Checkpoint, error) {
	if len(writes) == 0 {
		return s.put(ctx, cp, fence, cas)
	}
	if cp.ParentID == "" {
		return cp, &drover.InputError{Field: "writes", Rule: "pending writes are the parent's: give parent_checkpoint_id"}
	}
	if err := checkWrites(writes); err != nil {
		return cp, err
	}
	cp, b, err := encodeCheckpoint(cp, fence)
	if err != nil {
		return cp, err
	}
	head := s.keys.CheckpointHead(cp.ThreadID, keyspace.CheckpointNSName(cp.NS))
	// The parent's writes are not read first: a step's writes usually
	// come with the next checkpoint, none stored before them, so the first
	// try merges them into none and compares the key absent. A refusal
	// reads them with the parent and the head, and the next try merges
	// into what it read: one etcd request a put in the usual case, two
	// when writes were stored.
	var stored []*mvccpb.KeyValue
	for try := 0; try < maxWriteTries; try++ {
		pw, err := s.writesOf(cp.ThreadID, cp.NS, cp.ParentID).merged(cp.ThreadID, cp.ParentID, stored, writes)
		guessed := try == 0
		if guessed && (err != nil || len(pw.val)+len(b) > maxTxnBytes) {
			// Too large by the new writes alone: the stored ones decide (a
			// write replayed at an index keeps its stored value), so they
			// are read first, as for a put too large for one request.
			pw, err = s.mergedWrites(ctx, cp.ThreadID, cp.NS, cp.ParentID, writes)
			guessed = false
		}
		if err != nil {
			return cp, err
		}
		if len(pw.val)+len(b) > maxTxnBytes {
			if err := s.PutWrites(ctx, cp.ThreadID, cp.NS, cp.ParentID, writes, fence); err != nil {
				return cp, err
			}
			return s.putEncoded(ctx, cp, b, fence, cas)
		}
		// The parent's existence, the head and the parent's writes are
		// read on a refusal, to tell a missing parent or a moved head from
		// writes saved before or since.
		ok, fenced, read, err := s.commitElse(ctx, cp.ThreadID, cp.NS,
			append(pw.cmps, s.headCmps(cp, cas)...), append(s.putOps(cp, b), pw.op()),
			[]clientv3.Op{clientv3.OpGet(pw.cpKey, clientv3.WithCountOnly()), clientv3.OpGet(head), clientv3.OpGet(pw.key)}, fence)
		switch {
		case fenced:
			return cp, err
		case err != nil:
			return cp, fmt.Errorf("checkpoint: put %s/%s with its parent's writes: %w", cp.ThreadID, cp.ID, err)
		case ok:
			return cp, nil
		}
		if read[0].GetResponseRange().GetCount() == 0 {
			return cp, fmt.Errorf("%w: checkpoint %s of thread %s", ErrNotFound, cp.ParentID, cp.ThreadID)
		}
		if now := headOf(read[1]); cas && now != cp.ParentID {
			return cp, &ConflictError{ThreadID: cp.ThreadID, NS: cp.NS, Parent: cp.ParentID, Head: now}
		}
		// Writes were stored for the parent: merge into what was read. The
		// first try assumed none; a later refusal means another task saved
		// writes in between, and waits a little first.
		stored = read[2].GetResponseRange().GetKvs()
		if guessed {
			continue
		}
		if err := writesBackoff(ctx, try); err != nil {
			return cp, fmt.Errorf("checkpoint: put writes of %s/%s: %w", cp.ThreadID, cp.ParentID, err)
		}
	}
	return cp, fmt.Errorf("checkpoint: put writes of %s/%s: the writes kept changing under %d tries; try again", cp.ThreadID, cp.ParentID, maxWriteTries)
}
