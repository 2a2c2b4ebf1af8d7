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
	"go.etcd.io/etcd/api/v3/mvccpb"
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
	for try := 0; try < maxWriteTries; try++ {
		pw, err := s.mergedWrites(ctx, thread, ns, id, writes)
		if err != nil {
			return err
		}
		ok, fenced, err := s.commit(ctx, thread, ns, pw.cmps, []clientv3.Op{pw.op()}, fence)
		switch {
		case fenced:
			return err
		case err != nil:
			return fmt.Errorf("checkpoint: put writes of %s/%s: %w", thread, id, err)
		case ok:
			return nil
		}
		if g, err := s.cli.Get(ctx, pw.cpKey, clientv3.WithCountOnly()); err == nil && g.Count == 0 {
			return fmt.Errorf("%w: checkpoint %s of thread %s", ErrNotFound, id, thread)
		}
		// Another task saved writes in between: merge again.
		if err := writesBackoff(ctx, try); err != nil {
			return fmt.Errorf("checkpoint: put writes of %s/%s: %w", thread, id, err)
		}
	}
	return fmt.Errorf("checkpoint: put writes of %s/%s: the writes kept changing under %d tries; try again", thread, id, maxWriteTries)
}

// pendingWrites are the pending writes of a checkpoint, read and merged
// with new ones, ready to replace what was read.
type pendingWrites struct {
	// key holds the checkpoint's writes; cpKey is the checkpoint's own.
	key, cpKey string
	// val is the merged writes, encoded.
	val []byte
	// cmps hold while nothing changed since the read: the checkpoint
	// exists and nobody saved writes for it since.
	cmps []clientv3.Cmp
}

// op stores the merged writes.
func (pw pendingWrites) op() clientv3.Op { return clientv3.OpPut(pw.key, string(pw.val)) }

// mergedWrites reads the pending writes of checkpoint id and merges writes
// into them (see mergeWrites). Their encoding past MaxState is a
// *drover.InputError of field writes.
func (s *Etcd) mergedWrites(ctx context.Context, thread, ns, id string, writes []Write) (pendingWrites, error) {
	pw := s.writesOf(thread, ns, id)
	g, err := s.cli.Get(ctx, pw.key)
	if err != nil {
		return pw, fmt.Errorf("checkpoint: read writes of %s/%s: %w", thread, id, err)
	}
	return pw.merged(thread, id, g.Kvs, writes)
}

// writesOf is checkpoint id's pendingWrites before any are read or merged.
func (s *Etcd) writesOf(thread, ns, id string) pendingWrites {
	nsName := keyspace.CheckpointNSName(ns)
	return pendingWrites{key: s.keys.CheckpointWrites(thread, nsName, id), cpKey: s.keys.CheckpointKey(thread, nsName, id)}
}

// merged is pw with writes merged into stored (what a read of pw.key
// found: none, or the key), and the compares that hold while nothing
// changed since that read: with none stored, while the key is absent.
func (pw pendingWrites) merged(thread, id string, stored []*mvccpb.KeyValue, writes []Write) (pendingWrites, error) {
	var old []Write
	var rev int64
	if len(stored) == 1 {
		if err := json.Unmarshal(stored[0].Value, &old); err != nil {
			return pw, fmt.Errorf("checkpoint: writes of %s/%s are unreadable: %w", thread, id, err)
		}
		rev = stored[0].ModRevision
	}
	pw.val, _ = json.Marshal(mergeWrites(old, writes))
	if len(pw.val) > MaxState {
		return pw, &drover.InputError{Field: "writes", Value: fmt.Sprintf("%d bytes", len(pw.val)),
			Rule: fmt.Sprintf("the pending writes of one checkpoint must be at most %d bytes in etcd: keep large values in PostgreSQL or an object store and write a reference", MaxState)}
	}
	pw.cmps = []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(pw.cpKey), ">", 0),
		clientv3.Compare(clientv3.ModRevision(pw.key), "=", rev),
	}
	return pw, nil
}

// writesBackoff pauses before try+1 of a compare-and-swap of writes that
// another writer's got ahead of: a random while, longer with each try.
func writesBackoff(ctx context.Context, try int) error {
	return lifecycle.Sleep(ctx, time.Duration(rand.Int64N(int64(time.Millisecond)<<min(try, 6))))
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
