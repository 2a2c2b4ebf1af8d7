package stream

import (
	"time"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DoneOp returns the operation that writes the attempt's Done, with
// outcome and cause (""), for the transaction that stores its task's
// end: the Done is stored with the end or not at all, so no follower
// finds the task ended while its Done is on its way, and a worker gone
// between the two leaves neither. It is a nested transaction fenced by
// the stream alone (only if nothing was written after the attempt's
// end). ok is false, and nothing is to be written, unless End wrote the
// attempt's end (AttemptEnded) and it is the stream's last event as this
// process knows it: the task's end then closes the stream as before
// (Writer.Finish, after it).
func (at *Attempt) DoneOp(outcome, cause string) (op clientv3.Op, ok bool) {
	if !at.ended.Load() || (!at.wrote.Load() && !at.mayExist.Load()) {
		return clientv3.Op{}, false
	}
	a := at.a // set by End, on this goroutine (Touched)
	if a == nil || !a.known || a.err != nil || !a.exists || a.lastType != AttemptEnded || a.lastToken != at.c.Fence.Token() {
		return clientv3.Op{}, false
	}
	return at.w.doneOp(a, outcome, cause), true
}

// doneOp is the operation that writes a Done after attempt a's last
// event, as its attempt, if no chunk starts after it.
func (w *Writer) doneOp(a *attempt, outcome, cause string) clientv3.Op {
	now := w.now()
	seq := a.last + 1
	c := chunk{Attempt: a.lastAttempt, Token: a.lastToken, Events: a.events, Bytes: a.bytes}
	d := ownData{Attempt: a.lastAttempt, Outcome: outcome, Error: cause}
	c.List = []Event{{Seq: seq, Attempt: a.lastAttempt, Type: Done, Data: d.raw(), Time: now.UTC()}}
	key, start := keyspace.StreamChunkAt(w.keys.StreamChunks(a.c.Task), seq, seq)
	free := clientv3.Compare(clientv3.CreateRevision(start), "=", 0).WithPrefix()
	expiry := keyspace.TimedKey(w.keys.StreamExpiries(), now.Add(w.lim.Retention).UnixNano(), a.c.Task)
	return clientv3.OpTxn([]clientv3.Cmp{free}, []clientv3.Op{clientv3.OpPut(key, string(c.encode())), clientv3.OpPut(expiry, "")}, nil)
}

// NoDoneFollows is the end's time a check of WhenEndedAt gives for a
// task whose end was stored in one transaction with its Done (DoneOp),
// or with none to come: a follower that finds it ended with nothing
// more stored ends at once, without waiting for a late Done.
var NoDoneFollows = time.Unix(0, 0).UTC()
