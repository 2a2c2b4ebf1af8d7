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
// end). ok is false, and nothing is to be written, unless End stored
// the attempt's end (AttemptEnded): the task's end then closes the
// stream as before (Writer.Finish, after it). It is made from where End
// stored it, not from the Writer's state of the attempt, which a send
// of events queued before End may still read and set (fenced).
func (at *Attempt) DoneOp(outcome, cause string) (op clientv3.Op, ok bool) {
	end := at.end // set by End, on this goroutine
	if !at.ended.Load() || len(end.List) != 1 || end.List[0].Type != AttemptEnded || end.Token != at.c.Fence.Token() {
		return clientv3.Op{}, false
	}
	return at.w.doneOp(at.c.Task, end, outcome, cause), true
}

// doneOp is the operation that writes a Done of task after end, the
// chunk that stored an attempt's last event, as its attempt, if no
// chunk starts after it.
func (w *Writer) doneOp(task string, end chunk, outcome, cause string) clientv3.Op {
	now := w.now()
	seq := end.List[0].Seq + 1
	c := chunk{Attempt: end.Attempt, Token: end.Token, Events: end.Events, Bytes: end.Bytes}
	d := ownData{Attempt: end.Attempt, Outcome: outcome, Error: cause}
	c.List = []Event{{Seq: seq, Attempt: end.Attempt, Type: Done, Data: d.raw(), Time: now.UTC()}}
	key, start := keyspace.StreamChunkAt(w.keys.StreamChunks(task), seq, seq)
	free := clientv3.Compare(clientv3.CreateRevision(start), "=", 0).WithPrefix()
	expiry := keyspace.TimedKey(w.keys.StreamExpiries(), now.Add(w.lim.Retention).UnixNano(), task)
	return clientv3.OpTxn([]clientv3.Cmp{free}, []clientv3.Op{clientv3.OpPut(key, string(c.encode())), clientv3.OpPut(expiry, "")}, nil)
}

// NoDoneFollows is the end's time a check of WhenEndedAt gives for a
// task whose end was stored in one transaction with its Done (DoneOp),
// or with none to come: a follower that finds it ended with nothing
// more stored ends at once, without waiting for a late Done.
var NoDoneFollows = time.Unix(0, 0).UTC()
