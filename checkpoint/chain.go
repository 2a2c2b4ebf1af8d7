package checkpoint

import (
	"context"
	"fmt"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxChainLinks is the most checkpoints one PutChain takes. Up to
// maxChainTxnLinks of them go in one etcd transaction (etcd allows 128
// operations in one, and each link costs two: its checkpoint and its
// parent's writes).
const (
	MaxChainLinks    = 256
	maxChainTxnLinks = 32
)

// Link is one checkpoint of a chain, with the pending writes of its parent.
type Link struct {
	Checkpoint Checkpoint
	// ParentWrites are pending writes of Checkpoint.ParentID, saved with
	// it (as PutWithWrites saves them).
	ParentWrites []Write
}

// ChainError is a chain stored only in part: Stored links, the first ones,
// are stored, and the thread's head is the last of them. It wraps the
// error that stopped the rest. Only a chain too large for one etcd
// transaction is stored in parts; one that fits is stored whole or not at
// all.
type ChainError struct {
	Stored int
	Err    error
}

func (e *ChainError) Error() string {
	return fmt.Sprintf("checkpoint: %d checkpoints of the chain were stored before: %v", e.Stored, e.Err)
}

func (e *ChainError) Unwrap() error { return e.Err }

// PutChain puts links in order, each the parent of the next
// (links[i].Checkpoint.ParentID is links[i-1]'s id), each with its
// parent's pending writes, and lastWrites as pending writes of the last:
// what a run that does not wait for its checkpoints puts while one request
// is under way, in one request and, when it fits, one etcd transaction
// (one fsync, one fence check). The thread's head becomes the last link.
// With cas the first link's parent must be the head (a *ConflictError
// otherwise); without, it may be any checkpoint. Each link's checks and
// errors are Put's and PutWithWrites'. Every link needs its id.
//
// A chain that fits in one transaction (maxTxnBytes of states and writes,
// at most maxChainTxnLinks links) is stored whole or not at all; a larger
// one is stored link by link, and a failure part way is a *ChainError
// saying how many were stored. Storing a chain again (a lost answer) with
// cas false stores the same checkpoints and merges the same writes.
func (s *Etcd) PutChain(ctx context.Context, links []Link, lastWrites []Write, fence Fence, cas bool) ([]Checkpoint, error) {
	if err := checkChain(links, lastWrites); err != nil {
		return nil, err
	}
	cps := make([]Checkpoint, len(links))
	encoded := make([][]byte, len(links))
	size := 0
	for i, l := range links {
		cp, b, err := encodeCheckpoint(l.Checkpoint, fence)
		if err != nil {
			return nil, chainField(i, err)
		}
		cps[i], encoded[i] = cp, b
		size += len(b) + writesSize(l.ParentWrites)
	}
	size += writesSize(lastWrites)
	if size <= maxTxnBytes && len(links) <= maxChainTxnLinks {
		done, err := s.putChainTxn(ctx, links, cps, encoded, lastWrites, fence, cas)
		if done || err != nil {
			return cps, err
		}
	}
	// Too large for one transaction (or so once stored writes were merged
	// in): link by link, each as PutWithWrites stores it.
	for i, l := range links {
		if _, err := s.putWithWrites(ctx, l.Checkpoint, l.ParentWrites, fence, cas); err != nil {
			return cps, chainPart(i, err)
		}
	}
	if len(lastWrites) > 0 {
		last := cps[len(cps)-1]
		if err := s.PutWrites(ctx, last.ThreadID, last.NS, last.ID, lastWrites, fence); err != nil {
			return cps, chainPart(len(links), err)
		}
	}
	return cps, nil
}

// chainPart is err of a chain whose first stored links were stored.
func chainPart(stored int, err error) error {
	if stored == 0 {
		return err
	}
	return &ChainError{Stored: stored, Err: err}
}

// chainField names link i in the field of an input error.
func chainField(i int, err error) error {
	if ie, ok := err.(*drover.InputError); ok {
		c := *ie
		c.Field = fmt.Sprintf("checkpoints[%d].%s", i, ie.Field)
		return &c
	}
	return err
}

// checkChain checks that links are a chain of one thread and namespace,
// each named and the child of the one before.
func checkChain(links []Link, lastWrites []Write) error {
	if len(links) == 0 {
		return &drover.InputError{Field: "checkpoints", Rule: "must hold at least one checkpoint"}
	}
	if len(links) > MaxChainLinks {
		return &drover.InputError{Field: "checkpoints", Value: fmt.Sprint(len(links)), Rule: fmt.Sprintf("must hold at most %d checkpoints", MaxChainLinks)}
	}
	first := links[0].Checkpoint
	seen := make(map[string]bool, len(links))
	for i, l := range links {
		cp := l.Checkpoint
		if cp.ID == "" {
			return &drover.InputError{Field: fmt.Sprintf("checkpoints[%d].checkpoint_id", i), Rule: "every checkpoint of a chain needs its id"}
		}
		if seen[cp.ID] {
			return &drover.InputError{Field: fmt.Sprintf("checkpoints[%d].checkpoint_id", i), Value: cp.ID, Rule: "must appear once in the chain"}
		}
		seen[cp.ID] = true
		if cp.ThreadID != first.ThreadID || cp.NS != first.NS {
			return &drover.InputError{Field: fmt.Sprintf("checkpoints[%d]", i), Rule: "every checkpoint of a chain is of one thread and namespace"}
		}
		if i > 0 && cp.ParentID != links[i-1].Checkpoint.ID {
			return &drover.InputError{Field: fmt.Sprintf("checkpoints[%d].parent_checkpoint_id", i), Value: cp.ParentID,
				Rule: fmt.Sprintf("must be the id of checkpoints[%d] (%s): a chain's checkpoints follow one another", i-1, links[i-1].Checkpoint.ID)}
		}
		if len(l.ParentWrites) > 0 && cp.ParentID == "" {
			return &drover.InputError{Field: fmt.Sprintf("checkpoints[%d].parent_writes", i), Rule: "pending writes are the parent's: give parent_checkpoint_id"}
		}
		if err := checkPut(cp); err != nil {
			return chainField(i, err)
		}
		if err := checkWrites(l.ParentWrites); err != nil {
			return chainField(i, err)
		}
	}
	if seen[first.ParentID] {
		return &drover.InputError{Field: "checkpoints[0].parent_checkpoint_id", Value: first.ParentID,
			Rule: "must not be a checkpoint of the chain: a chain follows a checkpoint stored before it"}
	}
	return checkWrites(lastWrites)
}

// writesSize is about the bytes writes take encoded.
func writesSize(ws []Write) int {
	n := 0
	for _, w := range ws {
		n += len(w.Value)*4/3 + len(w.Channel) + len(w.TaskID) + 48
	}
	return n
}

// chainWrites are the pending writes one transaction of a chain saves:
// those of the first link's parent (which must exist), and those of links
// the transaction creates.
type chainWrites struct {
	ids    []string
	writes [][]Write
	// existing: ids[0] is the first link's parent, stored before.
	existing bool
}

// writesOfChain gathers the writes of a chain by the checkpoint they are for.
func writesOfChain(links []Link, lastWrites []Write) chainWrites {
	var cw chainWrites
	for i, l := range links {
		if len(l.ParentWrites) > 0 {
			cw.ids = append(cw.ids, l.Checkpoint.ParentID)
			cw.writes = append(cw.writes, l.ParentWrites)
			cw.existing = cw.existing || i == 0
		}
	}
	if len(lastWrites) > 0 {
		cw.ids = append(cw.ids, links[len(links)-1].Checkpoint.ID)
		cw.writes = append(cw.writes, lastWrites)
	}
	return cw
}

// putChainTxn stores the chain in one transaction. Its first try assumes
// no writes are stored for the checkpoints it writes writes for; a refusal
// reads them (with the first parent and the head) and the next try merges
// into what it read. done false with no error: merged with what was
// stored, the transaction would be too large, and nothing was stored.
func (s *Etcd) putChainTxn(ctx context.Context, links []Link, cps []Checkpoint, encoded [][]byte, lastWrites []Write, fence Fence, cas bool) (done bool, err error) {
	first, last := cps[0], cps[len(cps)-1]
	nsName := keyspace.CheckpointNSName(first.NS)
	head := s.keys.CheckpointHead(first.ThreadID, nsName)
	cw := writesOfChain(links, lastWrites)
	stored := make([][]*mvccpb.KeyValue, len(cw.ids))
	for try := 0; try < maxWriteTries; try++ {
		cmps := s.headCmps(first, cas)
		ops := make([]clientv3.Op, 0, len(cps)+len(cw.ids)+1)
		size := 0
		for i, cp := range cps {
			ops = append(ops, clientv3.OpPut(s.keys.CheckpointKey(cp.ThreadID, nsName, cp.ID), string(encoded[i])))
			size += len(encoded[i])
		}
		ops = append(ops, clientv3.OpPut(head, last.ID))
		els := []clientv3.Op{clientv3.OpGet(s.keys.CheckpointKey(first.ThreadID, nsName, first.ParentID), clientv3.WithCountOnly()), clientv3.OpGet(head)}
		for k, id := range cw.ids {
			pw, err := s.writesOf(first.ThreadID, first.NS, id).merged(first.ThreadID, id, stored[k], cw.writes[k])
			if err != nil {
				return false, err
			}
			c := pw.cmps
			if k > 0 || !cw.existing {
				c = c[1:] // the checkpoint is one this transaction writes
			}
			cmps = append(cmps, c...)
			ops = append(ops, pw.op())
			els = append(els, clientv3.OpGet(pw.key))
			size += len(pw.val)
		}
		if size > maxTxnBytes {
			return false, nil
		}
		ok, fenced, read, err := s.commitElse(ctx, first.ThreadID, first.NS, cmps, ops, els, fence)
		switch {
		case fenced:
			return false, err
		case err != nil:
			return false, fmt.Errorf("checkpoint: put a chain of %d checkpoints on %s/%s: %w", len(cps), first.ThreadID, first.ParentID, err)
		case ok:
			return true, nil
		}
		if cw.existing && read[0].GetResponseRange().GetCount() == 0 {
			return false, fmt.Errorf("%w: checkpoint %s of thread %s", ErrNotFound, first.ParentID, first.ThreadID)
		}
		if now := headOf(read[1]); cas && now != first.ParentID {
			return false, &ConflictError{ThreadID: first.ThreadID, NS: first.NS, Parent: first.ParentID, Head: now}
		}
		// Writes were stored (or stored since): merge into what was read.
		for k := range cw.ids {
			stored[k] = read[2+k].GetResponseRange().GetKvs()
		}
		if try == 0 {
			continue
		}
		if err := writesBackoff(ctx, try); err != nil {
			return false, fmt.Errorf("checkpoint: put a chain on %s/%s: %w", first.ThreadID, first.ParentID, err)
		}
	}
	return false, fmt.Errorf("checkpoint: put a chain on %s/%s: the writes kept changing under %d tries; try again", first.ThreadID, first.ParentID, maxWriteTries)
}

// headOf is the head a read of the head key found ("" for none).
func headOf(r *pb.ResponseOp) string {
	if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
		return string(kvs[0].Value)
	}
	return ""
}
