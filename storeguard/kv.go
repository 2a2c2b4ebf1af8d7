package storeguard

import (
	"context"
	"strings"

	"github.com/droverhq/drover/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// NewKV returns kv with admission: every transaction that compares a guard
// key as [NotFull] does (a data-plane write: a submission, a checkpoint, a
// task step) first reserves what its Then branch puts ([Cost]) with a,
// and is refused with a *drover.StoreFullError, without being sent, when
// that does not fit. The reservation is given back when etcd answers
// that the transaction's compares failed; a transaction that fails with an
// error keeps it, since it may have been applied. Every other request goes to kv unchanged. Install it
// as an etcd client's KV (cli.KV = storeguard.NewKV(cli.KV, a)) before the
// client is shared.
func NewKV(kv clientv3.KV, a *Admission) clientv3.KV {
	return &admitKV{KV: kv, a: a}
}

type admitKV struct {
	clientv3.KV
	a *Admission
}

// Txn implements clientv3.KV.
func (k *admitKV) Txn(ctx context.Context) clientv3.Txn {
	return &admitTxn{Txn: k.KV.Txn(ctx), a: k.a}
}

// admitTxn notes the guard's compare in If and the cost of Then, and
// reserves it at Commit.
type admitTxn struct {
	clientv3.Txn
	a       *Admission
	guarded bool
	cost    int64
}

func (t *admitTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	for _, c := range cs {
		t.guarded = t.guarded || isNotFull(c)
	}
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *admitTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.cost += Cost(ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *admitTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *admitTxn) Commit() (*clientv3.TxnResponse, error) {
	if !t.guarded {
		return t.Txn.Commit()
	}
	r, err := t.a.Reserve(t.cost)
	if err != nil {
		return nil, err
	}
	resp, err := t.Txn.Commit()
	// Only a transaction etcd answered, with its compares failed, certainly
	// wrote nothing. One that failed (a timeout, a lost connection, a
	// leader change) may have been applied all the same: its bytes stay
	// reserved until a measurement counts what was written.
	r.Done(err != nil || resp.Succeeded)
	return resp, err
}

// isNotFull reports whether c is the compare [NotFull] builds: the guard
// key of a namespace does not exist.
func isNotFull(c clientv3.Cmp) bool {
	pc := c.GetCompare()
	if pc.Target != pb.Compare_CREATE || pc.Result != pb.Compare_EQUAL || len(pc.RangeEnd) > 0 {
		return false
	}
	key := string(pc.Key)
	ns, ok := strings.CutSuffix(strings.TrimPrefix(key, "/"), "/store/full")
	if !ok {
		return false
	}
	s, err := keyspace.New(ns)
	return err == nil && s.StoreFull() == key
}

// Overheads of [Cost]: what etcd stores with each put beside its key and
// value (its revision, twice, the key's versions, the record's framing);
// what its database (bbolt) adds, an eighth more (branch pages rewritten,
// pages freed but not yet reusable while reads are open: measured, a
// burst of submissions grows the file by about 6 % more than its puts);
// and bbolt's page: a value larger than a quarter of one takes whole
// pages of its own.
const (
	putOverhead = 128
	pageSize    = 4096
)

// Cost estimates what ops add to etcd's database, in bytes: each put's key
// and value with etcd's overhead and an eighth more, a large one rounded
// up to whole pages; a nested transaction costs its larger branch;
// deletions and reads add nothing. It errs on the high side: a write
// refused a little early is tried again, one admitted past the quota
// stops every lease.
func Cost(ops ...clientv3.Op) int64 {
	var n int64
	for _, op := range ops {
		switch {
		case op.IsPut():
			c := (int64(len(op.KeyBytes())+len(op.ValueBytes())) + putOverhead) * 9 / 8
			if c > pageSize/4 {
				c = (c + pageSize - 1) / pageSize * pageSize
			}
			n += c
		case op.IsTxn():
			_, then, els := op.Txn()
			n += max(Cost(then...), Cost(els...))
		}
	}
	return n
}
