package queue

import (
	"context"

	"github.com/droverhq/drover/keyspace"
)

// segmentSlot is a task found by its index key in a segment.
type segmentSlot struct {
	id string
	at keyspace.TaskPlace
}

// segRef is where a task read from a segment is, and the revision of the
// read that found its state.
type segRef struct {
	queue, seg string
	slot       int
	rev        int64
}

// segmentSlots reads the tasks of slots from their segments, one read of
// state per segment. Tasks that left their segment in between (a record of
// their own holds them now) are returned as moved, by id; purged ones are
// left out.
func (c *Client) segmentSlots(ctx context.Context, slots []segmentSlot) (tasks []*Task, moved []string, err error) {
	type segKey struct{ q, seg string }
	states := map[segKey]*segState{}
	for _, s := range slots {
		k := segKey{s.at.Queue, s.at.Segment}
		st := states[k]
		if st == nil {
			if st, err = c.readState(ctx, k.q, k.seg); err != nil {
				return nil, nil, err
			}
			states[k] = st
		}
		ts, err := c.segmentTasks(ctx, k.q, k.seg)
		if err != nil {
			return nil, nil, err
		}
		t, ok := taskOf(ts, s.at.Slot)
		if !ok || t.ID != s.id {
			continue // the segment is gone: removed after its retention
		}
		if !st.open && st.n == 0 {
			st.n = len(ts) // a closed segment: every slot is finished
		}
		if !st.fill(t, s.at.Slot) {
			if st.moved[s.at.Slot] || st.exits[s.at.Slot] { // cancelled ones have records
				moved = append(moved, s.id)
			}
			continue
		}
		t.seg = &segRef{queue: k.q, seg: k.seg, slot: s.at.Slot, rev: st.rev}
		tasks = append(tasks, t)
	}
	return tasks, moved, nil
}
