package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/storeguard"
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
// Keys of thread T, checkpoint namespace N ("@" for the default ""):
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

func pad(t int64) string { return fmt.Sprintf("%020d", t) }

// commit applies ops if cmps hold, wrapped in the thread's token fence:
// they apply only if no token higher than the fence's was seen, and raise
// the highest seen to it. With an etcd lock the transaction is nested under
// the lock's own fence too. Every commit also requires that the store-full
// guard key is absent (these are data-plane writes): while it exists nothing
// is written and err is the guard's *drover.StoreFullError.
func (s *Etcd) commit(ctx context.Context, thread, ns string, cmps []clientv3.Cmp, ops []clientv3.Op, fence Fence) (ok bool, fenced bool, err error) {
	var txn clientv3.Txn
	if et, isEtcd := fence.(lease.Fence); isEtcd {
		txn = et.Txn(ctx)
	} else {
		txn = s.cli.Txn(ctx)
	}
	cmps = append(cmps[:len(cmps):len(cmps)], storeguard.NotFull(s.keys))
	if fence == nil {
		resp, err := txn.If(cmps...).Then(ops...).Else(storeguard.GetOp(s.keys)).Commit()
		if err != nil {
			return false, false, err
		}
		if !resp.Succeeded {
			return false, false, storeguard.FromRange(resp.Responses[0].GetResponseRange())
		}
		return true, false, nil
	}
	fk := s.keys.CheckpointFence(thread, ns)
	tok := fence.Token()
	withFence := append(ops[:len(ops):len(ops)], clientv3.OpPut(fk, pad(tok)))
	resp, err := txn.If(clientv3.Compare(clientv3.CreateRevision(fk), "=", 0)).
		Then(clientv3.OpTxn(cmps, withFence, []clientv3.Op{storeguard.GetOp(s.keys)})).
		Else(clientv3.OpTxn(append(cmps[:len(cmps):len(cmps)], clientv3.Compare(clientv3.Value(fk), "<", pad(tok+1))), withFence,
			[]clientv3.Op{clientv3.OpGet(fk), storeguard.GetOp(s.keys)})).
		Commit()
	if err != nil {
		if errors.Is(err, lock.ErrFenced) {
			return false, true, err
		}
		return false, false, err
	}
	inner := resp.Responses[0].GetResponseTxn()
	if inner.Succeeded {
		return true, false, nil
	}
	guard := inner.Responses[0]
	if !resp.Succeeded {
		if kvs := inner.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			if seen, _ := strconv.ParseInt(string(kvs[0].Value), 10, 64); seen > tok {
				return false, true, fmt.Errorf("%w: token %d is below %d, already seen for this thread", lock.ErrFenced, tok, seen)
			}
		}
		guard = inner.Responses[1]
	}
	return false, false, storeguard.FromRange(guard.GetResponseRange())
}

// Put writes cp as the new head; see Store.
func (s *Etcd) Put(ctx context.Context, cp Checkpoint, fence Fence) (Checkpoint, error) {
	if err := check(cp.ThreadID, cp.NS); err != nil {
		return cp, err
	}
	if err := checkState(cp); err != nil {
		return cp, err
	}
	if cp.ID == "" {
		cp.ID = NewID()
	}
	cp.CreatedAt = time.Now().UTC()
	if fence != nil {
		cp.Token = fence.Token()
	}
	b, err := json.Marshal(cp)
	if err != nil {
		return cp, err
	}
	head := s.keys.CheckpointHead(cp.ThreadID, cp.NS)
	var cmp clientv3.Cmp
	if cp.ParentID == "" {
		cmp = clientv3.Compare(clientv3.CreateRevision(head), "=", 0)
	} else {
		cmp = clientv3.Compare(clientv3.Value(head), "=", cp.ParentID)
	}
	ok, fenced, err := s.commit(ctx, cp.ThreadID, cp.NS, []clientv3.Cmp{cmp},
		[]clientv3.Op{clientv3.OpPut(s.keys.CheckpointKey(cp.ThreadID, cp.NS, cp.ID), string(b)), clientv3.OpPut(head, cp.ID)}, fence)
	switch {
	case fenced:
		return cp, err
	case err != nil:
		return cp, fmt.Errorf("checkpoint: put %s/%s: %w", cp.ThreadID, cp.ID, err)
	case !ok:
		cerr := &ConflictError{ThreadID: cp.ThreadID, NS: cp.NS, Parent: cp.ParentID}
		if g, err := s.cli.Get(ctx, head); err == nil && len(g.Kvs) > 0 {
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
	g, err := s.cli.Get(ctx, s.keys.CheckpointHead(thread, ns))
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
	g, err := s.cli.Get(ctx, s.keys.CheckpointKey(thread, ns, id))
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

// List returns the thread's checkpoints, newest first.
func (s *Etcd) List(ctx context.Context, thread, ns string, opts ListOptions) ([]Checkpoint, error) {
	if err := check(thread, ns); err != nil {
		return nil, err
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = 100
	}
	pre := s.keys.CheckpointKey(thread, ns, "")
	end := clientv3.GetPrefixRangeEnd(pre)
	if opts.Before != "" {
		end = pre + opts.Before
	}
	var out []Checkpoint
	for len(out) < limit {
		g, err := s.cli.Get(ctx, pre, clientv3.WithRange(end), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(limit)))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: list %s: %w", thread, err)
		}
		for _, kv := range g.Kvs {
			var cp Checkpoint
			if json.Unmarshal(kv.Value, &cp) != nil || !matches(cp.Metadata, opts.Filter) {
				continue
			}
			if out = append(out, cp); len(out) == limit {
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

func matches(m Metadata, filter map[string]string) bool {
	for k, v := range filter {
		switch strings.ToLower(k) {
		case "source":
			if m.Source != v {
				return false
			}
		case "writer":
			if m.Writer != v {
				return false
			}
		case "step":
			if strconv.Itoa(m.Step) != v {
				return false
			}
		default:
			if m.Extra[k] != v {
				return false
			}
		}
	}
	return true
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
