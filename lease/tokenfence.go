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

// NewTokenTxn starts an etcd transaction, sent through a transaction
// newTxn returns, fenced by s.Token: the caller's If/Then/Else run only if
// no write under a higher token was made at s.Key, and a Then that runs
// raises s.Key to s.Token in the same transaction. Commit returns the
// caller's response (its Then's or Else's responses only), or an error
// matching ErrFenced with nothing of the caller's applied.
//
// newTxn returns cli.Txn(ctx), or the Txn of a Fence to fence by both (an
// etcd lock's ownership and the token); Commit may call it more than once.
// A Txn with no compares and no operations only raises s.Key: a new holder
// does that first, so that every write of an older one fails from then on,
// even before the new holder writes.
func NewTokenTxn(newTxn func() clientv3.Txn, s TokenSpec) clientv3.Txn {
	return &tokenTxn{newTxn: newTxn, s: s}
}

type tokenTxn struct {
	newTxn    func() clientv3.Txn
	s         TokenSpec
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

// maxTokenTries bounds the sends of one Commit: s.Key found absent is
// created and the transaction sent again, which finds it absent again only
// if it was deleted in between (its thread's or task's data removed).
const maxTokenTries = 3

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

// Commit sends a transaction that carries the caller's operations once:
//
//	if the caller's compares hold and s.Key <= s.Token:
//		the caller's Then, put s.Key = s.Token
//	else:
//		get s.Key
//		if s.Key is absent: put s.Key = s.Token
//		else: the caller's Else
//
// and, when it created s.Key, sends it again (at most maxTokenTries
// sends; past them an error that is not ErrFenced). The read of s.Key
// tells a refused token from the caller's own compares failing.
//
// One request cannot guard a single copy of the operations by "s.Key
// absent, or at most s.Token": etcd's compares are a conjunction, a value
// compare fails on an absent key, and every compare of a request (a nested
// transaction's too) is evaluated before any of its operations runs, so
// that case takes two branches, each with its copy: a request twice the
// size of its operations, and a fenced checkpoint of more than about 560
// KiB state past etcd's request limit (1.5 MiB). Creating s.Key at s.Token
// apart from the caller's operations is safe: it is the value a write
// under s.Token would leave there, a later holder's higher token still
// passes the compare and raises it, and only a lower token, an earlier
// holder's, is refused from then on, as after a write of ours: what a
// holder's raise alone (a Txn with nothing of its own) does. So it is
// created whether or not the caller's compares hold: a write they refuse
// (a full store, a moved head) under a key absent until then leaves it at
// s.Token, and its Else runs on the next send. Done here, and not by each
// caller on a too large request, every fenced write is sent at its own
// size, with one request once the key exists.
//
// Against etcd's --max-txn-ops (128 a level, summed down the nesting) the
// transaction counts max(compares+1, Then+1, 2) + max(1, Else): as before,
// the caller's compares count once.
func (t *tokenTxn) Commit() (*clientv3.TxnResponse, error) {
	s := t.s
	put := clientv3.OpPut(s.Key, PadToken(s.Token))
	then := append(t.then[:len(t.then):len(t.then)], put)
	cmps := append(t.cmps[:len(t.cmps):len(t.cmps)], clientv3.Compare(clientv3.Value(s.Key), "<", PadToken(s.Token+1)))
	absent := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.Key), "=", 0)}
	els := []clientv3.Op{clientv3.OpGet(s.Key), clientv3.OpTxn(absent, []clientv3.Op{put}, t.els)}
	for try := 1; ; try++ {
		if s.Check != nil {
			if err := s.Check(); err != nil {
				return nil, fmt.Errorf("%w: %s token %d: %w", ErrFenced, s.Name, s.Token, err)
			}
		}
		resp, err := t.newTxn().If(cmps...).Then(then...).Else(els...).Commit()
		if err != nil {
			return nil, err // an error of the base's own fence matches ErrFenced already
		}
		if resp.Succeeded {
			resp.Responses = resp.Responses[:len(t.then)]
			return resp, nil
		}
		kvs, inner := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseTxn()
		if inner.Succeeded { // s.Key was absent, and is created now
			if try == maxTokenTries {
				return nil, fmt.Errorf("lease: %s token %d: its fence key %s was deleted under each of %d writes", s.Name, s.Token, s.Key, try)
			}
			continue
		}
		if len(kvs) > 0 {
			if seen, _ := strconv.ParseInt(string(kvs[0].Value), 10, 64); seen > s.Token {
				cause := fmt.Errorf("a higher token, %d, has written since", seen)
				if s.Lost != nil {
					s.Lost(cause)
				}
				return nil, fmt.Errorf("%w: %s token %d: %w", ErrFenced, s.Name, s.Token, cause)
			}
		}
		resp.Responses = inner.Responses // the caller's compares failed
		return resp, nil
	}
}
