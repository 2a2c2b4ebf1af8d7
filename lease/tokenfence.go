package lease

import (
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TokenSpec describes a fence by token alone: the right is held outside
// etcd (a lock on Redis, Redlock or the Paxos lock service), and what it
// guards is written to etcd. etcd keeps, at Key, the highest token any write
// under the fence was made with; a write with a lower token is refused.
type TokenSpec struct {
	// Name names what Key fences, in errors ("task report-42").
	Name string
	// Key holds the highest token seen, as PadToken writes it.
	Key string
	// Token is the writer's fencing token.
	Token int64
	// Check, if set, reports a loss known locally (a passed renewal
	// deadline) before anything is sent.
	Check func() error
	// Lost, if set, is told when etcd refused a write because a higher
	// token had written: the right is certainly lost.
	Lost func(cause error)
}

// PadToken is a token as a Key of TokenSpec holds it: 20 decimal digits,
// so that etcd's byte-wise compare of values orders tokens.
func PadToken(t int64) string { return fmt.Sprintf("%020d", t) }

// NewTokenTxn starts an etcd transaction, sent through base, fenced by
// s.Token: the caller's If/Then/Else run only if no write under a higher
// token was made at s.Key, and a Then that runs raises s.Key to s.Token in
// the same transaction. Commit returns the caller's response (its Then's or
// Else's responses only), or an error matching ErrFenced with nothing
// applied.
//
// base is cli.Txn(ctx), or the Txn of a Fence to fence by both (an etcd
// lock's ownership and the token). A Txn with no compares and no operations
// only raises s.Key: a new holder does that first, so that every write of
// an older one fails from then on, even before the new holder writes.
func NewTokenTxn(base clientv3.Txn, s TokenSpec) clientv3.Txn {
	return &tokenTxn{base: base, s: s}
}

type tokenTxn struct {
	base      clientv3.Txn
	s         TokenSpec
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

func (t *tokenTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	return t
}

func (t *tokenTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	return t
}

func (t *tokenTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.els = append(t.els, ops...)
	return t
}

// Commit sends one transaction. While s.Key is absent the caller's
// transaction runs as it is, plus the put of s.Key; once it exists the
// caller's compares also require s.Key at most s.Token, and the Else reads
// s.Key to tell a refused token from the caller's own compares failing.
func (t *tokenTxn) Commit() (*clientv3.TxnResponse, error) {
	s := t.s
	if s.Check != nil {
		if err := s.Check(); err != nil {
			return nil, fmt.Errorf("%w: %s token %d: %w", ErrFenced, s.Name, s.Token, err)
		}
	}
	then := append(t.then[:len(t.then):len(t.then)], clientv3.OpPut(s.Key, PadToken(s.Token)))
	atMost := clientv3.Compare(clientv3.Value(s.Key), "<", PadToken(s.Token+1))
	resp, err := t.base.
		If(clientv3.Compare(clientv3.CreateRevision(s.Key), "=", 0)).
		Then(clientv3.OpTxn(t.cmps, then, t.els)).
		Else(clientv3.OpTxn(append(t.cmps[:len(t.cmps):len(t.cmps)], atMost), then,
			append([]clientv3.Op{clientv3.OpGet(s.Key)}, t.els...))).
		Commit()
	if err != nil {
		return nil, err // an error of base's own fence matches ErrFenced already
	}
	inner := (*clientv3.TxnResponse)(resp.Responses[0].GetResponseTxn())
	inner.Header = resp.Header
	if inner.Succeeded {
		inner.Responses = inner.Responses[:len(t.then)]
		return inner, nil
	}
	if !resp.Succeeded {
		if kvs := inner.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			if seen, _ := strconv.ParseInt(string(kvs[0].Value), 10, 64); seen > s.Token {
				cause := fmt.Errorf("a higher token, %d, has written since", seen)
				if s.Lost != nil {
					s.Lost(cause)
				}
				return nil, fmt.Errorf("%w: %s token %d: %w", ErrFenced, s.Name, s.Token, cause)
			}
		}
		inner.Responses = inner.Responses[1:]
	}
	return inner, nil
}
