package stream

import (
	"context"
	"reflect"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// A batch's transaction is built as etcd's protobuf, not as the
// client's Op and Cmp values: the client clones every compare by
// reflection three times on its way (Compare, OpTxn, the request) and
// copies every key and value from string to bytes, which at a thousand
// streams a batch was a third of the writer's allocations. A stream's
// part lives in its group (one allocation a stream a batch), its claim's
// compares in its attempt (made once), and a batch's levels in one
// slab.

// txnPart is one stream's part of a batch: If(claim, free) Then(puts).
type txnPart struct {
	op   pb.RequestOp
	txn  pb.RequestOp_RequestTxn
	req  pb.TxnRequest
	free pb.Compare
	cmps [4]*pb.Compare // room for req.Compare
	ops  [3]*pb.RequestOp
	puts [3]struct {
		op  pb.RequestOp
		put pb.RequestOp_RequestPut
		req pb.PutRequest
	}
}

// createdNever is the target of a compare that no key of its range
// exists (create revision 0): shared, as marshalling only reads it.
var createdNever = &pb.Compare_CreateRevision{CreateRevision: 0}

// set makes p the part that puts kvs (key and value, in pairs) if the
// claim's compares hold and no key in [start, end) exists.
func (p *txnPart) set(claim []*pb.Compare, start, end []byte, kvs ...[]byte) {
	p.free.Key, p.free.RangeEnd = start, end
	p.free.Target, p.free.Result, p.free.TargetUnion = pb.Compare_CREATE, pb.Compare_EQUAL, createdNever
	p.req.Compare = append(append(p.cmps[:0], claim...), &p.free)
	p.req.Success = p.ops[:0]
	for i := 0; i+1 < len(kvs); i += 2 {
		put := &p.puts[i/2]
		put.req.Key, put.req.Value = kvs[i], kvs[i+1]
		put.put.RequestPut = &put.req
		put.op.Request = &put.put
		p.req.Success = append(p.req.Success, &put.op)
	}
	p.txn.RequestTxn = &p.req
	p.op.Request = &p.txn
}

// clientOp is p as the client's Op, for a client whose KV is not the
// plain one (a store guard's admission, an in-process client).
func (p *txnPart) clientOp() clientv3.Op {
	cmps := make([]clientv3.Cmp, len(p.req.Compare))
	for i, c := range p.req.Compare {
		cmps[i] = clientv3.FromCompare(c)
	}
	ops := make([]clientv3.Op, len(p.req.Success))
	for i, op := range p.req.Success {
		put := op.GetRequestPut()
		ops[i] = clientv3.OpPut(string(put.Key), string(put.Value))
	}
	return clientv3.OpTxn(cmps, ops, nil)
}

// chunkRange returns chunk key first-last under prefix, and the range
// [start, end) of the keys of every chunk that starts at first.
func chunkRange(prefix string, first, last int64) (key, start, end []byte) {
	k, s := keyspace.StreamChunkAt(prefix, first, last)
	b := make([]byte, len(k)+len(s))
	copy(b, k)
	copy(b[len(k):], s)
	b[len(b)-1]++ // the prefix's end: its last byte ('-') plus one
	return b[:len(k):len(k)], b[:len(s):len(s)], b[len(k):]
}

// rawKV is the protobuf KV client of cli when its KV is the client's
// own over a connection, nil otherwise (the batch then goes through
// cli.KV, whatever wraps it).
func rawKV(cli *clientv3.Client) pb.KVClient {
	if cli == nil {
		return nil
	}
	conn := cli.ActiveConnection()
	if conn == nil || reflect.TypeOf(cli.KV) != reflect.TypeOf(clientv3.NewKV(cli)) {
		return nil
	}
	return pb.NewKVClient(conn)
}

// send commits a batch of parts, each a nested level of at most
// streamsPerTxn streams; guarded: only while the store-full guard key
// is absent (its read in the Else branch).
func (w *Writer) sendParts(ctx context.Context, parts [][]*group, guarded bool) (*clientv3.TxnResponse, error) {
	if w.kv == nil {
		txn := w.cli.Txn(ctx)
		if guarded {
			txn = txn.If(storeguard.NotFull(w.keys))
		}
		ops := make([]clientv3.Op, len(parts))
		for i, part := range parts {
			pops := make([]clientv3.Op, len(part))
			for j, g := range part {
				pops[j] = g.part.clientOp()
			}
			ops[i] = clientv3.OpTxn(nil, pops, nil)
		}
		txn = txn.Then(ops...)
		if guarded {
			txn = txn.Else(storeguard.GetOp(w.keys))
		}
		return txn.Commit()
	}
	n := 0
	for _, part := range parts {
		n += len(part)
	}
	levels := make([]struct {
		op  pb.RequestOp
		txn pb.RequestOp_RequestTxn
		req pb.TxnRequest
	}, len(parts))
	top := make([]*pb.RequestOp, len(parts))
	inner := make([]*pb.RequestOp, 0, n)
	for i, part := range parts {
		from := len(inner)
		for _, g := range part {
			inner = append(inner, &g.part.op)
		}
		l := &levels[i]
		l.req.Success = inner[from:len(inner):len(inner)]
		l.txn.RequestTxn = &l.req
		l.op.Request = &l.txn
		top[i] = &l.op
	}
	req := &pb.TxnRequest{Success: top}
	if guarded {
		req.Compare = []*pb.Compare{w.guardCmp}
		req.Failure = []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: w.guardKey}}}}
	}
	resp, err := w.kv.Txn(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.TxnResponse)(resp), nil
}
