package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/storeguard"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Etcd is the etcd checkpoint store (small state, the default).
//
// Its writes (Put, PutWrites) are data-plane writes: while the namespace's
// store-full guard key exists (the server sets it when etcd's database
// nears its quota; see package storeguard) they write nothing and return a
// *drover.StoreFullError, matched by drover.ErrStoreFull. DeleteThread
// frees space and is always accepted.
//
// Keys of thread T, checkpoint namespace N ("@" for the default "", and
// "~" with its base64url encoding when it is not a plain name: see
// keyspace.CheckpointNSName):
//
//	.../checkpoints/T/N/head              id of the head checkpoint
//	.../checkpoints/T/N/cp/{id}           a checkpoint
//	.../checkpoints/T/N/writes/{id}/{task}/{i}  pending writes
//	.../checkpoints/T/N/fence             highest token seen, 20 digits
type Etcd struct {
	cli  *clientv3.Client
	keys keyspace.Space
}

var _ Store = (*Etcd)(nil)

// NewEtcd returns the etcd store of namespace ns.
func NewEtcd(cli *clientv3.Client, ns string) (*Etcd, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	return &Etcd{cli: cli, keys: keys}, nil
}

// commit applies ops if cmps hold, wrapped in the thread's token fence
// (lease.NewTokenTxn): they apply only if no token higher than the fence's
// was seen, and raise the highest seen to it. With an etcd lock the
// transaction is nested under the lock's own fence too. Every commit also
// requires that the store-full guard key is absent (these are data-plane
// writes): while it exists nothing is written and err is the guard's
// *drover.StoreFullError.
func (s *Etcd) commit(ctx context.Context, thread, ns string, cmps []clientv3.Cmp, ops []clientv3.Op, fence Fence) (ok bool, fenced bool, err error) {
	ok, fenced, _, err = s.commitElse(ctx, thread, ns, cmps, ops, nil, fence)
	return ok, fenced, err
}

// commitElse is commit that also reads els when cmps fail (and the store
// is not full), in the same transaction: read is their responses, so that
// the caller tells which compare failed without another request.
func (s *Etcd) commitElse(ctx context.Context, thread, ns string, cmps []clientv3.Cmp, ops, els []clientv3.Op, fence Fence) (ok, fenced bool, read []*pb.ResponseOp, err error) {
	newTxn := func() clientv3.Txn { return s.cli.Txn(ctx) }
	if et, isEtcd := fence.(lease.Fence); isEtcd {
		newTxn = func() clientv3.Txn { return et.Txn(ctx) }
	}
	var txn clientv3.Txn
	if fence != nil {
		txn = lease.NewTokenTxn(newTxn, lease.TokenSpec{Name: "thread " + thread,
			Key: s.keys.CheckpointFence(thread, keyspace.CheckpointNSName(ns)), Token: fence.Token()})
	} else {
		txn = newTxn()
	}
	cmps = append(cmps[:len(cmps):len(cmps)], storeguard.NotFull(s.keys))
	resp, err := txn.If(cmps...).Then(ops...).Else(append([]clientv3.Op{storeguard.GetOp(s.keys)}, els...)...).Commit()
	switch {
	case errors.Is(err, lock.ErrFenced):
		return false, true, nil, err
	case err != nil:
		return false, false, nil, err
	case !resp.Succeeded:
		if err := storeguard.FromRange(resp.Responses[0].GetResponseRange()); err != nil {
			return false, false, nil, err
		}
		return false, false, resp.Responses[1:], nil
	}
	return true, false, nil, nil
}

// Put writes cp as the new head if its parent is the head; see Store.
func (s *Etcd) Put(ctx context.Context, cp Checkpoint, fence Fence) (Checkpoint, error) {
	return s.put(ctx, cp, fence, true)
}

// Append writes cp as the new head whatever the head is; see Store.
func (s *Etcd) Append(ctx context.Context, cp Checkpoint, fence Fence) (Checkpoint, error) {
	return s.put(ctx, cp, fence, false)
}

// put writes cp and moves the head to it, if cas only when its parent is
// the head.
func (s *Etcd) put(ctx context.Context, cp Checkpoint, fence Fence, cas bool) (Checkpoint, error) {
	cp, b, err := encodeCheckpoint(cp, fence)
	if err != nil {
		return cp, err
	}
	return s.putEncoded(ctx, cp, b, fence, cas)
}

// encodeCheckpoint checks cp and fills in what a put gives it (an id when
// it has none, its time, the fence's token): cp as stored, and its
// encoding.
func encodeCheckpoint(cp Checkpoint, fence Fence) (Checkpoint, []byte, error) {
	if err := checkPut(cp); err != nil {
		return cp, nil, err
	}
	if err := checkState(cp); err != nil {
		return cp, nil, err
	}
	if cp.ID == "" {
		cp.ID = NewID()
	}
	cp.CreatedAt = time.Now().UTC()
	if fence != nil {
		cp.Token = fence.Token()
	}
	if _, err := encodeMetadata(cp.Metadata); err != nil {
		return cp, nil, err
	}
	b, err := json.Marshal(cp)
	if err != nil {
		return cp, nil, fmt.Errorf("checkpoint: encode %s/%s: %w", cp.ThreadID, cp.ID, err)
	}
	return cp, b, nil
}

// headCmps are the compares of a put of cp: none for an append; with cas,
// that its parent is the head (none for a thread's first).
func (s *Etcd) headCmps(cp Checkpoint, cas bool) []clientv3.Cmp {
	head := s.keys.CheckpointHead(cp.ThreadID, keyspace.CheckpointNSName(cp.NS))
	switch {
	case !cas:
		return nil
	case cp.ParentID == "":
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(head), "=", 0)}
	default:
		return []clientv3.Cmp{clientv3.Compare(clientv3.Value(head), "=", cp.ParentID)}
	}
}

// putOps store cp, encoded as b, and make it the head.
func (s *Etcd) putOps(cp Checkpoint, b []byte) []clientv3.Op {
	ns := keyspace.CheckpointNSName(cp.NS)
	return []clientv3.Op{clientv3.OpPut(s.keys.CheckpointKey(cp.ThreadID, ns, cp.ID), string(b)),
		clientv3.OpPut(s.keys.CheckpointHead(cp.ThreadID, ns), cp.ID)}
}

// putEncoded is put of cp, checked and encoded as b.
func (s *Etcd) putEncoded(ctx context.Context, cp Checkpoint, b []byte, fence Fence, cas bool) (Checkpoint, error) {
	ok, fenced, err := s.commit(ctx, cp.ThreadID, cp.NS, s.headCmps(cp, cas), s.putOps(cp, b), fence)
	switch {
	case fenced:
		return cp, err
	case err != nil:
		return cp, fmt.Errorf("checkpoint: put %s/%s: %w", cp.ThreadID, cp.ID, err)
	case !ok:
		cerr := &ConflictError{ThreadID: cp.ThreadID, NS: cp.NS, Parent: cp.ParentID}
		if g, err := s.cli.Get(ctx, s.keys.CheckpointHead(cp.ThreadID, keyspace.CheckpointNSName(cp.NS))); err == nil && len(g.Kvs) > 0 {
			cerr.Head = string(g.Kvs[0].Value)
		}
		return cp, cerr
	}
	return cp, nil
}

// GetLatest returns the thread's head checkpoint.
func (s *Etcd) GetLatest(ctx context.Context, thread, ns string) (*Checkpoint, error) {
	if err := check(thread, ns); err != nil {
		return nil, err
	}
	g, err := s.cli.Get(ctx, s.keys.CheckpointHead(thread, keyspace.CheckpointNSName(ns)))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: latest of %s: %w", thread, err)
	}
	if len(g.Kvs) == 0 {
		return nil, fmt.Errorf("%w: thread %s has no checkpoint", ErrNotFound, thread)
	}
	return s.Get(ctx, thread, ns, string(g.Kvs[0].Value))
}

// Get returns checkpoint id of the thread.
func (s *Etcd) Get(ctx context.Context, thread, ns, id string) (*Checkpoint, error) {
	if err := check(thread, ns); err != nil {
		return nil, err
	}
	g, err := s.cli.Get(ctx, s.keys.CheckpointKey(thread, keyspace.CheckpointNSName(ns), id))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: get %s/%s: %w", thread, id, err)
	}
	if len(g.Kvs) == 0 {
		return nil, fmt.Errorf("%w: checkpoint %s of thread %s", ErrNotFound, id, thread)
	}
	cp := new(Checkpoint)
	if err := json.Unmarshal(g.Kvs[0].Value, cp); err != nil {
		return nil, fmt.Errorf("checkpoint: %s/%s is unreadable: %w", thread, id, err)
	}
	return cp, nil
}

// List returns the thread's checkpoints, newest first; with
// opts.AllNamespaces those of every checkpoint namespace, with
// opts.AllThreads those of every thread (see ListOptions).
func (s *Etcd) List(ctx context.Context, thread, ns string, opts ListOptions) ([]Checkpoint, error) {
	f, err := checkList(thread, ns, &opts)
	if err != nil {
		return nil, err
	}
	if opts.AllThreads {
		return s.listThreads(ctx, ns, opts, f)
	}
	return s.listThread(ctx, thread, ns, opts, f)
}

// listThread lists one thread: namespace ns, or with opts.AllNamespaces
// every namespace, newest first.
func (s *Etcd) listThread(ctx context.Context, thread, ns string, opts ListOptions, f filter) ([]Checkpoint, error) {
	if !opts.AllNamespaces {
		return s.list(ctx, thread, ns, opts, f)
	}
	nss, err := s.namespaces(ctx, thread)
	if err != nil {
		return nil, err
	}
	var out []Checkpoint
	for _, n := range nss {
		cps, err := s.list(ctx, thread, n, opts, f)
		if err != nil {
			return nil, err
		}
		out = append(out, cps...)
	}
	return newestFirst(out, opts.Limit), nil
}

// newestFirst sorts checkpoints of several namespaces by id, newest first
// (then by namespace), and keeps the first limit.
func newestFirst(cps []Checkpoint, limit int) []Checkpoint {
	sort.Slice(cps, func(i, j int) bool {
		if cps[i].ID != cps[j].ID {
			return cps[i].ID > cps[j].ID
		}
		return cps[i].NS < cps[j].NS
	})
	return cps[:min(len(cps), limit)]
}

// namespaces returns the checkpoint namespaces of thread that have keys,
// reading one key of each: after a namespace's first key it skips past all
// of that namespace's keys.
func (s *Etcd) namespaces(ctx context.Context, thread string) ([]string, error) {
	pre := s.keys.Checkpoints(thread)
	from, end := pre, clientv3.GetPrefixRangeEnd(pre)
	var out []string
	for {
		g, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: namespaces of %s: %w", thread, err)
		}
		if len(g.Kvs) == 0 {
			return out, nil
		}
		key := string(g.Kvs[0].Key)
		ns, ok := s.keys.CheckpointNSOfKey(thread, key)
		if !ok { // the thread's interrupt key
			from = key + "\x00"
			continue
		}
		out = append(out, ns)
		from = clientv3.GetPrefixRangeEnd(s.keys.CheckpointBase(thread, keyspace.CheckpointNSName(ns)))
	}
}

// list returns the checkpoints of one namespace of the thread, newest
// first.
func (s *Etcd) list(ctx context.Context, thread, ns string, opts ListOptions, f filter) ([]Checkpoint, error) {
	pre := s.keys.CheckpointKeys(thread, keyspace.CheckpointNSName(ns))
	end := clientv3.GetPrefixRangeEnd(pre)
	if opts.Before != "" {
		end = s.keys.CheckpointKey(thread, keyspace.CheckpointNSName(ns), opts.Before)
	}
	var out []Checkpoint
	for len(out) < opts.Limit {
		g, err := s.cli.Get(ctx, pre, clientv3.WithRange(end), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(opts.Limit)))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: list %s: %w", thread, err)
		}
		for _, kv := range g.Kvs {
			var cp Checkpoint
			if json.Unmarshal(kv.Value, &cp) != nil || !f.matches(cp.Metadata) {
				continue
			}
			if out = append(out, cp); len(out) == opts.Limit {
				break
			}
		}
		if !g.More || len(g.Kvs) == 0 {
			break
		}
		end = string(g.Kvs[len(g.Kvs)-1].Key)
	}
	return out, nil
}

// DeleteThread deletes every checkpoint, write and fence of the thread.
func (s *Etcd) DeleteThread(ctx context.Context, thread string) error {
	if err := keyspace.CheckName("thread_id", thread); err != nil {
		return err
	}
	if _, err := s.cli.Delete(ctx, s.keys.Checkpoints(thread), clientv3.WithPrefix()); err != nil {
		return fmt.Errorf("checkpoint: delete thread %s: %w", thread, err)
	}
	return nil
}
