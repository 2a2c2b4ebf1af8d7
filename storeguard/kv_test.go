package storeguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// lostReplyKV is a clientv3.KV whose transactions are committed by etcd
// but answered with an error, as when the reply of a commit is lost to a
// timeout.
type lostReplyKV struct{ clientv3.KV }

func (k lostReplyKV) Txn(ctx context.Context) clientv3.Txn { return lostReplyTxn{k.KV.Txn(ctx)} }

type lostReplyTxn struct{ clientv3.Txn }

func (t lostReplyTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { return lostReplyTxn{t.Txn.If(cs...)} }
func (t lostReplyTxn) Then(ops ...clientv3.Op) clientv3.Txn { return lostReplyTxn{t.Txn.Then(ops...)} }
func (t lostReplyTxn) Else(ops ...clientv3.Op) clientv3.Txn { return lostReplyTxn{t.Txn.Else(ops...)} }
func (t lostReplyTxn) Commit() (*clientv3.TxnResponse, error) {
	if _, err := t.Txn.Commit(); err != nil {
		return nil, err
	}
	return nil, context.DeadlineExceeded
}

// TestNewKVKeepsAmbiguousWrites: a guarded transaction that etcd applied
// but whose commit returned an error (its reply lost to a timeout) keeps
// its reservation: it may have been written, and it was. It used to give
// its bytes back.
func TestNewKVKeepsAmbiguousWrites(t *testing.T) {
	t.Parallel()
	raw := srv.Client(t)
	cli := srv.Client(t)
	a, c := newAdmission()
	cli.KV = storeguard.NewKV(lostReplyKV{cli.KV}, a)
	ctx := context.Background()
	keys := keyspace.MustNew(etcdtest.Namespace(t))
	measure(a, c, "m1", t0, 0, false)
	put := clientv3.OpPut(keys.Root()+"d/lost", strings.Repeat("v", 10_000))
	_, err := cli.Txn(ctx).If(storeguard.NotFull(keys)).Then(put).Commit()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("commit with its reply lost: %v", err)
	}
	if g, err := raw.Get(ctx, keys.Root()+"d/lost"); err != nil || len(g.Kvs) != 1 {
		t.Fatalf("the write did not reach etcd: %v, %v", g, err)
	}
	if st := a.Stats(); st.Reserved != storeguard.Cost(put) {
		t.Fatalf("reserved %d after an ambiguous commit, want its cost %d", st.Reserved, storeguard.Cost(put))
	}
}
