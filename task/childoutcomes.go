package task

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ChildOutcome is how a child ended, as its parent reads it: its status
// (ChildSucceeded, ChildDead, ChildCancelled), its result (JSON; a result
// that is other text is a JSON string) or its error.
type ChildOutcome struct {
	ID     string          `json:"id,omitempty"`
	Status string          `json:"status"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// childScope is what Children reads in a step's context: the children the
// step before spawned.
type childScope struct {
	s    *Store
	id   string
	step int
}

type childScopeKey struct{}

// withChildren gives the step after checkpoint cp its children's outcomes.
func (r *stepRun) withChildren(ctx context.Context, cp Checkpoint) context.Context {
	if cp.Spawn == nil {
		return ctx
	}
	return context.WithValue(ctx, childScopeKey{}, &childScope{s: r.s, id: r.id, step: cp.Step})
}

// childPage is how many outcomes Children reads a request.
const childPage = 500

// Children returns the outcomes of the children the step before this one
// spawned, in id order; none when it spawned none. Under SpawnOptions.Wait
// some may not have ended yet: they are not listed. It reads them
// ChildrenPage at a time.
func Children(ctx context.Context) ([]ChildOutcome, error) {
	var out []ChildOutcome
	after := ""
	for {
		page, next, err := ChildrenPage(ctx, after, childPage)
		if err != nil {
			return out, err
		}
		out = append(out, page...)
		if next == "" {
			return out, nil
		}
		after = next
	}
}

// ChildrenPage returns up to limit outcomes of the children the step
// before this one spawned, those with ids after after ("" for the first),
// and the id to give as after for the next page ("" after the last).
func ChildrenPage(ctx context.Context, after string, limit int) ([]ChildOutcome, string, error) {
	sc, ok := ctx.Value(childScopeKey{}).(*childScope)
	if !ok {
		return nil, "", nil
	}
	return sc.s.ChildrenOf(ctx, sc.id, sc.step, after, limit)
}

// ChildrenOf returns up to limit outcomes of the children step step of
// task id spawned, with ids after after, and the id to continue after (""
// after the last).
func (s *Store) ChildrenOf(ctx context.Context, id string, step int, after string, limit int) ([]ChildOutcome, string, error) {
	if limit <= 0 {
		limit = childPage
	}
	pre := s.keys.ChildDones(id, step)
	from := pre
	if after != "" {
		from = pre + after + "\x00"
	}
	g, err := s.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, "", fmt.Errorf("task %s: read the outcomes of its children: %w", id, err)
	}
	out := make([]ChildOutcome, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		var o ChildOutcome
		if err := json.Unmarshal(kv.Value, &o); err != nil {
			return nil, "", fmt.Errorf("task %s: outcome %s is unreadable: %w", id, kv.Key, err)
		}
		o.ID = keyspace.Rest(pre, string(kv.Key))
		out = append(out, o)
	}
	next := ""
	if g.More && len(out) > 0 {
		next = out[len(out)-1].ID
	}
	return out, next, nil
}
