package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/droverhq/drover/storeguard"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// storePage is how many items a scan of the store reads at once: at most
// 16 MiB of values.
const storePage = 64

// maxStoreScan bounds the keys one search or namespace listing examines
// (a filtered search reads items until it has its page; a listing reads
// a key per namespace, skipping the rest of its items): past it the
// request is refused (errStoreScan) rather than read on.
var maxStoreScan = 50_000

// errStoreScan is a scan that examined maxStoreScan keys and was not
// done: the caller's 400 names what to narrow.
var errStoreScan = errors.New("agentserver: the scan examined its limit of keys")

// putStoreItem writes value as item key of namespace ns, keeping its
// created_at when it exists; its updated_at is later than the one it
// replaces even within one millisecond. The write compares the item's
// revision with what it read (a change that raced another is made
// again) and the store guard (507).
func (s *server) putStoreItem(ctx context.Context, ns []string, key string, value json.RawMessage) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	k := sp.AgentStoreItem(ns, key)
	for range maxAttempts {
		resp, err := s.cfg.Etcd.Get(ctx, k)
		if err != nil {
			return etcdError("reading the item", err)
		}
		now := s.now()
		rec := storeRecord{Value: value, CreatedAt: now, UpdatedAt: now}
		var rev int64
		if len(resp.Kvs) > 0 {
			var old storeRecord
			if err := json.Unmarshal(resp.Kvs[0].Value, &old); err != nil {
				return undecodable("store item", key, err)
			}
			rev = resp.Kvs[0].ModRevision
			rec.CreatedAt = old.CreatedAt
			if !now.After(old.UpdatedAt) {
				rec.UpdatedAt = old.UpdatedAt.Add(time.Millisecond)
			}
		}
		raw, _ := json.Marshal(rec)
		t, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev), storeguard.NotFull(sp)).
			Then(clientv3.OpPut(k, string(raw))).Else(storeguard.GetOp(sp)).Commit()
		if err != nil {
			return etcdError("storing the item", err)
		}
		if t.Succeeded {
			return nil
		}
		if err := guardOf(t, 0); err != nil {
			return err
		}
	}
	return errRaced("the item")
}

// getStoreItem is item key of namespace ns; nil when there is none.
func (s *server) getStoreItem(ctx context.Context, ns []string, key string) (*StoreItem, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentStoreItem(ns, key))
	if err != nil {
		return nil, etcdError("reading the item", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var rec storeRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return nil, undecodable("store item", key, err)
	}
	return &StoreItem{Namespace: ns, Key: key, Value: rec.Value, CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt}, nil
}

// deleteStoreItem deletes item key of namespace ns, if it exists.
func (s *server) deleteStoreItem(ctx context.Context, ns []string, key string) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	if _, err := s.cfg.Etcd.Delete(ctx, sp.AgentStoreItem(ns, key)); err != nil {
		return etcdError("deleting the item", err)
	}
	return nil
}

// scanStore calls f with each key under prefix in key order, pages of
// storePage read at one revision, until f answers false; f may answer a
// key to go on from (past the rest of a namespace), later than the one it
// was given. It examines at most maxStoreScan keys (errStoreScan).
func (s *server) scanStore(ctx context.Context, prefix string, keysOnly bool, f func(kv *mvccpb.KeyValue) (skipTo string, more bool, err error)) error {
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	var rev int64
	for examined := 0; examined < maxStoreScan; {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(min(storePage, maxStoreScan-examined)))}
		if keysOnly {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cfg.Etcd.Get(ctx, from, opts...)
		if err != nil {
			return etcdError("reading the store", err)
		}
		rev = resp.Header.Revision
		skip := ""
		for _, kv := range resp.Kvs {
			if string(kv.Key) < skip {
				continue
			}
			examined++
			next, more, err := f(kv)
			if err != nil || !more {
				return err
			}
			skip = max(skip, next)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = max(string(resp.Kvs[len(resp.Kvs)-1].Key)+"\x00", skip)
		if from >= end {
			return nil
		}
	}
	return errStoreScan
}

// searchStore is the items whose namespace starts with prefix and whose
// value matches filter, from offset on, at most limit of them and at
// most maxStoreAnswerBytes of values.
func (s *server) searchStore(ctx context.Context, prefix []string, filter map[string]any, offset, limit int) ([]StoreItem, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	items := []StoreItem{}
	size := 0
	err = s.scanStore(ctx, sp.AgentStorePrefix(prefix), false, func(kv *mvccpb.KeyValue) (string, bool, error) {
		ns, key, ok := sp.ParseAgentStoreItem(string(kv.Key))
		if !ok {
			return "", true, nil
		}
		var rec storeRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			return "", false, undecodable("store item", key, err)
		}
		if len(filter) > 0 {
			var v map[string]any
			if err := json.Unmarshal(rec.Value, &v); err != nil {
				return "", false, undecodable("store item", key, err)
			}
			if !matchStoreFilter(v, filter) {
				return "", true, nil
			}
		}
		if offset > 0 {
			offset--
			return "", true, nil
		}
		if size += len(kv.Value); size > maxStoreAnswerBytes && len(items) > 0 {
			return "", false, nil
		}
		items = append(items, StoreItem{Namespace: ns, Key: key, Value: rec.Value, CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt})
		return "", len(items) < limit, nil
	})
	if errors.Is(err, errStoreScan) {
		field := "body.offset"
		if len(filter) > 0 {
			field = "body.filter"
		}
		return nil, badInput(field, nil, fmt.Sprintf("a search examines at most %d items under its namespace_prefix: this one had not filled its page by then; narrow body.namespace_prefix (or the offset)", maxStoreScan))
	}
	return items, err
}

// matchStoreFilter says whether value meets every condition of filter:
// operators (see storeOps), or else containment as jsonb @>.
func matchStoreFilter(value, filter map[string]any) bool {
	for k, fv := range filter {
		iv, present := value[k]
		m, ok := fv.(map[string]any)
		if !ok || !isOperators(m) {
			if !present || !contains(iv, fv) {
				return false
			}
			continue
		}
		for op, x := range m {
			if !matchStoreOp(iv, present, op, x) {
				return false
			}
		}
	}
	return true
}

// matchStoreOp applies one operator of a filter to an item's value iv.
func matchStoreOp(iv any, present bool, op string, x any) bool {
	eq := func(a, b any) bool { return present && jsonEqual(a, b) }
	switch op {
	case "$eq":
		return eq(iv, x)
	case "$ne":
		return !eq(iv, x)
	case "$in", "$nin":
		list, _ := x.([]any)
		found := slices.ContainsFunc(list, func(y any) bool { return eq(iv, y) })
		return found == (op == "$in")
	}
	c, ok := compareJSON(iv, x)
	if !present || !ok {
		return false
	}
	switch op {
	case "$gt":
		return c > 0
	case "$gte":
		return c >= 0
	case "$lt":
		return c < 0
	case "$lte":
		return c <= 0
	}
	return false
}

// jsonEqual says whether two decoded JSON values are equal.
func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(normal(a))
	y, _ := json.Marshal(normal(b))
	return string(x) == string(y)
}

// compareJSON orders two numbers or two strings; false for other pairs.
func compareJSON(a, b any) (int, bool) {
	switch av := normal(a).(type) {
	case float64:
		if bv, ok := normal(b).(float64); ok {
			switch {
			case av < bv:
				return -1, true
			case av > bv:
				return 1, true
			}
			return 0, true
		}
	case string:
		if bv, ok := b.(string); ok {
			return strings.Compare(av, bv), true
		}
	}
	return 0, false
}

// storeNamespaces is the distinct namespaces of the store's items that
// match prefix and suffix ("*" matches any label), each cut to depth
// labels (0: whole), in the order of their labels.
func (s *server) storeNamespaces(ctx context.Context, prefix, suffix []string, depth int) ([][]string, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	literal := prefix
	if i := slices.Index(prefix, "*"); i >= 0 {
		literal = prefix[:i]
	}
	seen := map[string]bool{}
	out := [][]string{}
	// One key per namespace: past it, the scan goes on after the rest of
	// its items (after every namespace under it once cut to depth).
	err = s.scanStore(ctx, sp.AgentStorePrefix(literal), true, func(kv *mvccpb.KeyValue) (string, bool, error) {
		ns, _, ok := sp.ParseAgentStoreItem(string(kv.Key))
		if !ok {
			return "", true, nil
		}
		if !labelsMatch(ns, prefix, false) || !labelsMatch(ns, suffix, true) {
			return clientv3.GetPrefixRangeEnd(sp.AgentStoreNamespace(ns)), true, nil
		}
		next := clientv3.GetPrefixRangeEnd(sp.AgentStoreNamespace(ns))
		if depth > 0 && len(ns) > depth {
			ns = ns[:depth]
			next = clientv3.GetPrefixRangeEnd(sp.AgentStorePrefix(ns))
		}
		if id := strings.Join(ns, "\x00"); !seen[id] {
			seen[id] = true
			out = append(out, ns)
		}
		return next, true, nil
	})
	if errors.Is(err, errStoreScan) {
		return nil, badInput("body.prefix", prefix, fmt.Sprintf("a listing examines at most %d namespaces: narrow body.prefix (or body.max_depth)", maxStoreScan))
	}
	slices.SortFunc(out, slices.Compare)
	return out, err
}

// labelsMatch says whether ns starts (or, with atEnd, ends) with want,
// "*" matching any label.
func labelsMatch(ns, want []string, atEnd bool) bool {
	if len(want) > len(ns) {
		return false
	}
	if atEnd {
		ns = ns[len(ns)-len(want):]
	}
	for i, w := range want {
		if w != "*" && w != ns[i] {
			return false
		}
	}
	return true
}
