package lease

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrFenced is matched by the error of a write made under a fence that no
// longer holds: nothing of it was applied. (lock.ErrFenced is the same
// error.)
var ErrFenced = errors.New("lock: fenced out")

// Fence is a right held under a lease: an etcd lock, a queue task's claim, a
// task runner's hold on its task. It is the one type every fenced write
// accepts (task steps, checkpoints, a handler's own writes).
type Fence interface {
	// Token is the right's fencing token: it strictly increases each time
	// the right changes hands. Pass it to what the holder writes
	// elsewhere, so that a write made after the right was lost can be
	// refused there too.
	Token() int64
	// Txn starts an etcd transaction that commits only while the right is
	// held with Token; see NewFencedTxn.
	Txn(ctx context.Context) clientv3.Txn
	// Context is cancelled the moment the right is lost or given up.
	Context() context.Context
	// Err is nil while the right is held as far as this process knows,
	// and the cause once it is not.
	Err() error
}

// Spec describes a right held in etcd for NewFencedTxn.
type Spec struct {
	// Name names the right in errors ("lock \"x\"", "claim of task y").
	Name string
	// Token is the right's fencing token.
	Token int64
	// Cmp holds while the right is held with Token.
	Cmp clientv3.Cmp
	// Also holds while the right is held too, beside Cmp (a queue task
	// claimed in a run: that the task was not cancelled since).
	Also []clientv3.Cmp
	// Check, if set, reports a loss known locally (a passed lease deadline)
	// before anything is sent.
	Check func() error
	// Lost, if set, is told when etcd refused a write under the fence.
	Lost func(cause error)
}

// NewFencedTxn starts an etcd transaction that commits only while s holds.
// It is used like clientv3.Txn: the caller's If/Then/Else run nested inside
// one transaction whose own compare is s.Cmp. Commit returns the caller's
// response, or an error matching ErrFenced, with nothing applied.
//
// etcd has no fencing of its own beyond compares; this is drover's, so that
// every right fences the same way.
func NewFencedTxn(ctx context.Context, cli *clientv3.Client, s Spec) clientv3.Txn {
	return &fencedTxn{cli: cli, s: s, ctx: ctx}
}

type fencedTxn struct {
	cli       *clientv3.Client
	s         Spec
	ctx       context.Context
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

func (t *fencedTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	return t
}

func (t *fencedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	return t
}

func (t *fencedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.els = append(t.els, ops...)
	return t
}

// Commit sends one transaction: if the fence holds, the caller's transaction
// runs nested inside it; otherwise nothing runs.
func (t *fencedTxn) Commit() (*clientv3.TxnResponse, error) {
	s := t.s
	if s.Check != nil {
		if err := s.Check(); err != nil {
			return nil, fmt.Errorf("%w: %s token %d: %w", ErrFenced, s.Name, s.Token, err)
		}
	}
	resp, err := t.cli.Txn(t.ctx).
		If(append([]clientv3.Cmp{s.Cmp}, s.Also...)...).
		Then(clientv3.OpTxn(t.cmps, t.then, t.els)).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("lock: fenced transaction under %s: %w", s.Name, err)
	}
	if !resp.Succeeded {
		cause := errors.New("a write under it was refused: it is held by a later token or free")
		if s.Lost != nil {
			s.Lost(cause)
		}
		return nil, fmt.Errorf("%w: %s token %d: %w", ErrFenced, s.Name, s.Token, cause)
	}
	inner := (*clientv3.TxnResponse)(resp.Responses[0].GetResponseTxn())
	inner.Header = resp.Header
	return inner, nil
}
