package task

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ChildCount is how the children of one step of a task stand: whether
// every one was submitted, how many ended, and how many of those ended
// DEAD or CANCELLED. Every reader of a step's children counts them here:
// a parent's wait, the agent task's children route and the task views.
type ChildCount struct {
	Step         int
	Submitted    bool
	Done, Failed int64
}

// countBatch is how many steps one count-only transaction takes (three
// operations a step; etcd allows 128 a request by default).
const countBatch = 40

// CountSteps counts the children of each of steps of task id, countBatch
// steps a transaction, with count-only reads (no key or value is sent).
// It returns the counts in the order of steps and the revision the last
// transaction read at.
func (s *Store) CountSteps(ctx context.Context, id string, steps []int) ([]ChildCount, int64, error) {
	out := make([]ChildCount, 0, len(steps))
	var rev int64
	for start := 0; start < len(steps); start += countBatch {
		batch := steps[start:min(start+countBatch, len(steps))]
		ops := make([]clientv3.Op, 0, 3*len(batch))
		for _, st := range batch {
			ops = append(ops,
				clientv3.OpGet(s.keys.ChildSubmitted(id, st), clientv3.WithCountOnly()),
				clientv3.OpGet(s.keys.ChildDones(id, st), clientv3.WithPrefix(), clientv3.WithCountOnly()),
				clientv3.OpGet(s.keys.ChildFaileds(id, st), clientv3.WithPrefix(), clientv3.WithCountOnly()))
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, 0, fmt.Errorf("task %s: count the children of steps %v: %w", id, batch, err)
		}
		rev = resp.Header.Revision
		for i, st := range batch {
			r := resp.Responses[3*i : 3*i+3]
			out = append(out, ChildCount{
				Step:      st,
				Submitted: r[0].GetResponseRange().Count > 0,
				Done:      r[1].GetResponseRange().Count,
				Failed:    r[2].GetResponseRange().Count,
			})
		}
	}
	return out, rev, nil
}
