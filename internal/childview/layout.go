package childview

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// stepLayout is a step that spawned children, as a committed checkpoint
// says: its counts and the chunks of its plan, in order.
type stepLayout struct {
	Step
	chunks []int
}

// layout is every step of a task that spawned children.
type layout struct {
	steps []stepLayout
}

// readLayout reads which steps of task parent spawned children, their
// plan chunks and their counts. Only a step a committed checkpoint says
// spawned counts: the step the task is at when its checkpoint holds a
// SpawnRecord (its first Chunks chunks), and an earlier step whose
// children were marked submitted (which happens only after its checkpoint
// was committed); chunks a run that crashed before its checkpoint left
// (a step run again that spawned fewer, or none) are not children.
func readLayout(ctx context.Context, src Source, keys keyspace.Space, parent string) (layout, error) {
	g, err := src.Etcd.Get(ctx, keys.ChildPlans(parent), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return layout{}, fmt.Errorf("children of %s: list their plan chunks: %w", parent, err)
	}
	if len(g.Kvs) == 0 {
		return layout{}, nil
	}
	chunks := map[int][]int{}
	lastRev := map[int]int64{}
	for _, kv := range g.Kvs {
		if step, k, ok := keys.ParseChildPlanChunk(parent, string(kv.Key)); ok {
			chunks[step] = append(chunks[step], k)
			lastRev[step] = max(lastRev[step], kv.ModRevision)
		}
	}
	cg, err := src.Etcd.Get(ctx, keys.TaskCheckpoint(parent))
	if err != nil {
		return layout{}, fmt.Errorf("children of %s: read its checkpoint: %w", parent, err)
	}
	var cp task.Checkpoint
	if len(cg.Kvs) > 0 {
		if err := json.Unmarshal(cg.Kvs[0].Value, &cp); err != nil {
			return layout{}, fmt.Errorf("children of %s: its checkpoint is unreadable: %w", parent, err)
		}
	}
	var steps []int
	for s := range chunks {
		if s < cp.Step || (s == cp.Step && cp.Spawn != nil) {
			steps = append(steps, s)
		}
	}
	slices.Sort(steps)
	counted, err := count(ctx, src, parent, steps)
	if err != nil {
		return layout{}, err
	}
	var l layout
	for _, st := range counted {
		sl := stepLayout{Step: st, chunks: chunks[st.Step]}
		if st.Step == cp.Step {
			if cp.Spawn.Chunks > 0 { // a record without it predates the field
				sl.chunks = slices.DeleteFunc(sl.chunks, func(k int) bool { return k >= cp.Spawn.Chunks })
			}
			sl.Spawned = cp.Spawn.N
		} else {
			if !st.Submitted {
				continue // a step run again that spawned nothing: its plan is a crashed run's
			}
			if sl.Spawned, err = pastCount(ctx, src, keys, parent, st.Step, lastRev[st.Step], len(sl.chunks)); err != nil {
				return layout{}, err
			}
		}
		done := st.Succeeded + st.Failed
		sl.Live = max(0, int64(sl.Spawned)-done)
		l.steps = append(l.steps, sl)
	}
	return l, nil
}

// count reads the counts of every step's children (task.Store.CountSteps):
// Submitted, Succeeded and Failed (Spawned and Live are the caller's).
func count(ctx context.Context, src Source, parent string, steps []int) ([]Step, error) {
	store, err := task.NewStore(src.Etcd, src.Namespace)
	if err != nil {
		return nil, err
	}
	counted, _, err := store.CountSteps(ctx, parent, steps)
	if err != nil {
		return nil, fmt.Errorf("children of %s: %w", parent, err)
	}
	out := make([]Step, len(counted))
	for i, c := range counted {
		out[i] = Step{Step: c.Step, Submitted: c.Submitted, Succeeded: c.Done - c.Failed, Failed: c.Failed}
	}
	return out, nil
}

// pastCounts keeps how many children a step before the one its task is at
// spawned: its checkpoint's SpawnRecord is gone, and its plan never
// changes once a later step ran, so it is read whole once per process.
// An entry is known by the step's last chunk's revision and chunk count;
// the map holds at most pastCountsMax, dropping any when full.
var pastCounts = struct {
	sync.Mutex
	m map[string]pastCountEntry
}{m: map[string]pastCountEntry{}}

const pastCountsMax = 4096

type pastCountEntry struct {
	rev    int64
	chunks int
	n      int
}

// pastCount returns how many children step step of task parent spawned, a
// step before the one the task is at.
func pastCount(ctx context.Context, src Source, keys keyspace.Space, parent string, step int, rev int64, chunks int) (int, error) {
	id := keys.ChildPlan(parent, step)
	pastCounts.Lock()
	e, ok := pastCounts.m[id]
	pastCounts.Unlock()
	if ok && e.rev == rev && e.chunks == chunks {
		return e.n, nil
	}
	g, err := src.Etcd.Get(ctx, id, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("children of %s: read the plan of step %d: %w", parent, step, err)
	}
	n := 0
	for _, kv := range g.Kvs {
		var part []json.RawMessage
		if err := json.Unmarshal(kv.Value, &part); err != nil {
			return 0, fmt.Errorf("children of %s: plan chunk %s is unreadable: %w", parent, kv.Key, err)
		}
		n += len(part)
	}
	pastCounts.Lock()
	if len(pastCounts.m) >= pastCountsMax {
		for k := range pastCounts.m {
			delete(pastCounts.m, k)
			break
		}
	}
	pastCounts.m[id] = pastCountEntry{rev: rev, chunks: chunks, n: n}
	pastCounts.Unlock()
	return n, nil
}

// page reads up to limit children from cursor at on, a chunk at a time,
// and the cursor of the next page ("" after the last).
func (l layout) page(ctx context.Context, cli *clientv3.Client, keys keyspace.Space, parent string, at Cursor, limit int) ([]listed, string, error) {
	var out []listed
	for _, st := range l.steps {
		if st.Step.Step < at.Step {
			continue
		}
		for _, k := range st.chunks {
			if st.Step.Step == at.Step && k < at.Chunk {
				continue
			}
			from := 0
			if st.Step.Step == at.Step && k == at.Chunk {
				from = at.Offset
			}
			if len(out) == limit {
				return out, Cursor{Step: st.Step.Step, Chunk: k, Offset: from}.String(), nil
			}
			g, err := cli.Get(ctx, keys.ChildPlanChunk(parent, st.Step.Step, k))
			if err != nil {
				return nil, "", fmt.Errorf("children of %s: read chunk %d of the plan of step %d: %w", parent, k, st.Step.Step, err)
			}
			if len(g.Kvs) == 0 {
				continue // the task's keys went meanwhile
			}
			var part []task.Child
			if err := json.Unmarshal(g.Kvs[0].Value, &part); err != nil {
				return nil, "", fmt.Errorf("children of %s: plan chunk %s is unreadable: %w", parent, g.Kvs[0].Key, err)
			}
			for i := from; i < len(part); i++ {
				if len(out) == limit {
					return out, Cursor{Step: st.Step.Step, Chunk: k, Offset: i}.String(), nil
				}
				out = append(out, listed{Child: part[i], step: st.Step.Step})
			}
		}
	}
	return out, "", nil
}
