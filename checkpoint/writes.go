package checkpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/lifecycle"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxWriteTries bounds the compare-and-swap retries of PutWrites when other
// tasks save writes for the same checkpoint at the same moment.
const maxWriteTries = 100

// PutWrites saves pending writes for checkpoint id, fenced like Put, all or
// nothing, each at its Write.Idx as LangGraph's savers do (and the
// PostgreSQL store): a write at an index >= 0 is saved only if its task has
// no write at that index yet, the first of a call's duplicates; one at a
// negative index (a special channel's) replaces the task's earlier one.
//
// The pending writes of one checkpoint are one etcd key, rewritten by
// compare-and-swap: etcd allows 128 operations in a request, so a key per
// write failed past about 126 writes in one call, and one key costs a single
// write however many there are. They share the checkpoint state's bound,
// MaxState encoded. While the store-full guard key exists it writes nothing
// and returns a *drover.StoreFullError.
func (s *Etcd) PutWrites(ctx context.Context, thread, ns, id string, writes []Write, fence Fence) error {
	if err := check(thread, ns); err != nil {
		return err
	}
	if err := checkWrites(writes); err != nil {
		return err
	}
	nsName := keyspace.CheckpointNSName(ns)
	key, cpKey := s.keys.CheckpointWrites(thread, nsName, id), s.keys.CheckpointKey(thread, nsName, id)
	for try := 0; try < maxWriteTries; try++ {
		g, err := s.cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("checkpoint: read writes of %s/%s: %w", thread, id, err)
		}
		var stored []Write
		var rev int64
		if len(g.Kvs) == 1 {
			if err := json.Unmarshal(g.Kvs[0].Value, &stored); err != nil {
				return fmt.Errorf("checkpoint: writes of %s/%s are unreadable: %w", thread, id, err)
			}
			rev = g.Kvs[0].ModRevision
		}
		b, _ := json.Marshal(mergeWrites(stored, writes))
		if len(b) > MaxState {
			return &drover.InputError{Field: "writes", Value: fmt.Sprintf("%d bytes", len(b)),
				Rule: fmt.Sprintf("the pending writes of one checkpoint must be at most %d bytes in etcd: keep large values in PostgreSQL or an object store and write a reference", MaxState)}
		}
		ok, fenced, err := s.commit(ctx, thread, ns, []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(cpKey), ">", 0),
			clientv3.Compare(clientv3.ModRevision(key), "=", rev),
		}, []clientv3.Op{clientv3.OpPut(key, string(b))}, fence)
		switch {
		case fenced:
			return err
		case err != nil:
			return fmt.Errorf("checkpoint: put writes of %s/%s: %w", thread, id, err)
		case ok:
			return nil
		}
		if g, err := s.cli.Get(ctx, cpKey, clientv3.WithCountOnly()); err == nil && g.Count == 0 {
			return fmt.Errorf("%w: checkpoint %s of thread %s", ErrNotFound, id, thread)
		}
		// Another task saved writes in between: merge again.
		if err := lifecycle.Sleep(ctx, time.Duration(rand.Int64N(int64(time.Millisecond)<<min(try, 6)))); err != nil {
			return fmt.Errorf("checkpoint: put writes of %s/%s: %w", thread, id, err)
		}
	}
	return fmt.Errorf("checkpoint: put writes of %s/%s: the writes kept changing under %d tries; try again", thread, id, maxWriteTries)
}

// mergeWrites adds writes to stored by task and index: insert-if-absent at
// an index >= 0, replace at a negative one. The result is ordered by task
// then index.
func mergeWrites(stored []Write, writes []Write) []Write {
	type at struct {
		task string
		idx  int
	}
	pos := make(map[at]int, len(stored)+len(writes))
	for i, w := range stored {
		pos[at{w.TaskID, w.Idx}] = i
	}
	for _, w := range writes {
		if k, ok := pos[at{w.TaskID, w.Idx}]; ok {
			if w.Idx < 0 {
				stored[k] = w
			}
			continue
		}
		pos[at{w.TaskID, w.Idx}] = len(stored)
		stored = append(stored, w)
	}
	sort.SliceStable(stored, func(i, j int) bool {
		if stored[i].TaskID != stored[j].TaskID {
			return stored[i].TaskID < stored[j].TaskID
		}
		return stored[i].Idx < stored[j].Idx
	})
	return stored
}

// Writes returns the pending writes saved for checkpoint id, ordered by task
// then index.
func (s *Etcd) Writes(ctx context.Context, thread, ns, id string) ([]Write, error) {
	if err := check(thread, ns); err != nil {
		return nil, err
	}
	g, err := s.cli.Get(ctx, s.keys.CheckpointWrites(thread, keyspace.CheckpointNSName(ns), id))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: writes of %s/%s: %w", thread, id, err)
	}
	out := []Write{}
	if len(g.Kvs) == 0 {
		return out, nil
	}
	if err := json.Unmarshal(g.Kvs[0].Value, &out); err != nil {
		return nil, fmt.Errorf("checkpoint: writes of %s/%s are unreadable: %w", thread, id, err)
	}
	return out, nil
}
