package checkpoint

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// listThreads lists every thread of the store's namespace (opts.AllThreads):
// threads in key order, each as listThread gives it, until opts.Limit
// checkpoints are found.
//
// It finds the threads by reading keys only, one at a time: after a
// thread's first key it skips past all of that thread's keys, so a thread
// costs one key read however many checkpoints it has, plus what listThread
// reads of it (its namespaces, keys only, and at most the remaining limit
// of checkpoints of each). It stops at the thread that fills the limit, so
// work grows with the threads before that one; a Before or Filter that
// matches nothing reads every thread.
func (s *Etcd) listThreads(ctx context.Context, ns string, opts ListOptions, f filter) ([]Checkpoint, error) {
	pre := s.keys.CheckpointThreads()
	from, end := pre, clientv3.GetPrefixRangeEnd(pre)
	var out []Checkpoint
	for len(out) < opts.Limit {
		g, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: list every thread: %w", err)
		}
		if len(g.Kvs) == 0 {
			break
		}
		key := string(g.Kvs[0].Key)
		thread, ok := s.keys.CheckpointThreadOfKey(key)
		if !ok { // not a thread's key: none is written there
			from = key + "\x00"
			continue
		}
		part := opts
		part.Limit = opts.Limit - len(out)
		cps, err := s.listThread(ctx, thread, ns, part, f)
		if err != nil {
			return nil, err
		}
		out = append(out, cps...)
		from = clientv3.GetPrefixRangeEnd(s.keys.Checkpoints(thread))
	}
	return out, nil
}
