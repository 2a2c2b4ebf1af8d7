package queue

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The marks of an outcome request are puts it makes once at its top level
// whatever number of its outcomes call for them: a parent's wake mark, a
// priority level's marker. Each nested transaction carries the marks of
// its own outcomes, so that a request puts those of the ones it holds, and
// is split by them: etcd takes 128 operations a level.

// maxTxnOps is the most operations a request packs at its top level plus
// the widest of its nested transactions, within etcd's 128.
const maxTxnOps = 127

// setMarks gives every request of reqs the marks markers, those of the
// outcomes they record together.
func setMarks(reqs []ackReq, markers map[string]bool) {
	if len(markers) == 0 {
		return
	}
	keys := make([]string, 0, len(markers))
	for k := range markers {
		keys = append(keys, k)
	}
	for i := range reqs {
		reqs[i].marks = keys
	}
}

// marksOf are the puts of the marks of reqs, each key once.
func marksOf(reqs []ackReq) []clientv3.Op {
	seen := map[string]bool{}
	var out []clientv3.Op
	for _, r := range reqs {
		for _, k := range r.marks {
			if !seen[k] {
				seen[k] = true
				out = append(out, clientv3.OpPut(k, ""))
			}
		}
	}
	return out
}

// packReqs splits reqs into the requests etcd takes, in order, and calls
// send with each one's bounds: within maxRequestBytes, and with one
// operation a nested transaction plus the marks of them all, each once,
// plus the widest of them within maxTxnOps. A request alone over it is
// sent alone.
func packReqs(reqs []ackReq, send func(from, to int)) {
	from, size, width := 0, 0, 0
	marks := map[string]bool{}
	for k, r := range reqs {
		fresh := 0
		for _, m := range r.marks {
			if !marks[m] {
				fresh++
			}
		}
		if k > from && (size+r.size > maxRequestBytes || k-from+1+len(marks)+fresh+max(width, r.width()) > maxTxnOps) {
			send(from, k)
			from, size, width = k, 0, 0
			clear(marks)
		}
		size, width = size+r.size, max(width, r.width())
		for _, m := range r.marks {
			marks[m] = true
		}
	}
	if from < len(reqs) {
		send(from, len(reqs))
	}
}

// putMarks puts marks in requests of their own, for outcomes written in a
// request that had no room for them.
func putMarks(ctx context.Context, cli *clientv3.Client, marks []clientv3.Op) error {
	for len(marks) > 0 {
		n := min(len(marks), maxTxnOps)
		if _, err := cli.Txn(ctx).Then(marks[:n]...).Commit(); err != nil {
			return err
		}
		marks = marks[n:]
	}
	return nil
}
