package stream

import (
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fixedFence is a claim that holds, with one compare.
type fixedFence struct{ token int64 }

func (f fixedFence) Token() int64 { return f.token }
func (f fixedFence) Compares() []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision("claims/x"), "=", f.token)}
}
func (f fixedFence) Err() error { return nil }

// TestStreamPartIsOneLevel: a stream's part of a batch is one
// transaction holding its claim's compares and its own (its place is
// free), with the chunk's writes and no transaction nested in it: etcd
// decodes, checks and applies each level apart, a thousand a batch.
func TestStreamPartIsOneLevel(t *testing.T) {
	w := NewWriter(nil, keyspace.MustNew("t"), Limits{}, 0)
	for _, exists := range []bool{false, true} {
		a := &attempt{c: Claim{Task: "x", Attempt: 1, Fence: fixedFence{7}}, known: true, exists: exists, last: 4, lastToken: 7}
		g := &group{a: a, reqs: []*request{{a: a, events: []Input{{Type: "token", Data: []byte(`{"text":"a"}`)}}, at: time.Unix(1, 0)}}}
		w.build(g)
		tx := g.part.op.GetRequestTxn()
		if g.done || tx == nil {
			t.Fatalf("exists %v: the stream's part is %+v (answered %v), want one transaction", exists, g.part.op.Request, g.done)
		}
		cmps, then, els := tx.Compare, tx.Success, tx.Failure
		if len(cmps) != 2 || len(els) != 0 {
			t.Fatalf("exists %v: %d compares and %d operations if they fail, want 2 (the claim's, the free place) and none", exists, len(cmps), len(els))
		}
		if free := cmps[1]; string(free.Key) != "/t/tasks/x/stream/000000000005-" || string(free.RangeEnd) != "/t/tasks/x/stream/000000000005." ||
			free.Target != pb.Compare_CREATE || free.GetCreateRevision() != 0 {
			t.Fatalf("exists %v: the free place's compare is %v", exists, free)
		}
		for _, op := range then {
			if op.GetRequestPut() == nil {
				t.Fatalf("exists %v: an operation of the stream's part is not a put (a nested level): %+v", exists, op)
			}
		}
		// As the client's Op (a client whose KV is wrapped), the same.
		if ccmps, cthen, _ := g.part.clientOp().Txn(); len(ccmps) != len(cmps) || len(cthen) != len(then) {
			t.Fatalf("exists %v: as the client's Op, %d compares and %d puts", exists, len(ccmps), len(cthen))
		}
		if want := map[bool]int{false: 2, true: 1}[exists]; len(then) != want { // the chunk, and the expiry key of a new stream
			t.Fatalf("exists %v: %d puts, want %d", exists, len(then), want)
		}
	}
}

// TestRequestsAfterAnEndInOneBatchAreFenced: in one batch, a claim's
// requests queued behind its end are fenced and add nothing after it.
func TestRequestsAfterAnEndInOneBatchAreFenced(t *testing.T) {
	w := NewWriter(nil, keyspace.MustNew("t"), Limits{}, 0)
	a := &attempt{c: Claim{Task: "x", Attempt: 1, Fence: fixedFence{7}}, known: true, exists: true, last: 4, lastToken: 7, lastType: "log"}
	end := &request{a: a, end: &Input{Type: AttemptEnded, Data: []byte(`{}`)}, at: time.Unix(1, 0)}
	late := &request{a: a, events: []Input{{Type: "late"}}, at: time.Unix(1, 0)}
	g := &group{a: a, reqs: []*request{{a: a, events: []Input{{Type: "log"}}, at: time.Unix(1, 0)}, end, late}}
	w.build(g)
	if !late.done || !errors.Is(late.err, ErrFenced) {
		t.Fatalf("the write behind the end: done %v, err %v, want fenced", late.done, late.err)
	}
	if n := len(g.written.List); n != 2 || g.written.List[n-1].Type != AttemptEnded {
		t.Fatalf("the chunk holds %+v, want the event and the end last", g.written.List)
	}
	// The head now ends the claim's attempt: a later batch is fenced.
	a.lastType = AttemptEnded
	again := &request{a: a, events: []Input{{Type: "late"}}, at: time.Unix(2, 0)}
	w.build(&group{a: a, reqs: []*request{again}})
	if !errors.Is(again.err, ErrFenced) {
		t.Fatalf("a write after the ended head: %v, want ErrFenced", again.err)
	}
}
