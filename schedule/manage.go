package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Update applies edit to schedule name and stores it when it is valid.
// A change of when it fires (cron, tz, every, jitter) points it at the
// first tick from now; other changes keep its next fire. The name cannot
// change.
func (c *Client) Update(ctx context.Context, name string, edit func(s *Schedule)) (Schedule, error) {
	r, err := c.change(ctx, name, func(r *record) ([]clientv3.Op, error) {
		old := r.Spec
		s := old
		edit(&s)
		s.NextFireAt = time.Time{}
		if s.Name != name {
			return nil, inputErr("name", s.Name, "cannot change: create a schedule of the new name and delete this one")
		}
		s = s.withDefaults()
		if err := s.Validate(); err != nil {
			return nil, err
		}
		r.Spec = s
		if old.Cron != s.Cron || old.TZ != s.TZ || old.Every != s.Every || old.Jitter != s.Jitter || old.Paused != s.Paused {
			return nil, c.schedule(r, c.now())
		}
		return nil, nil
	})
	if err != nil {
		return Schedule{}, err
	}
	return r.view(), nil
}

// Pause stops schedule name's fires until Resume; a trigger still fires.
func (c *Client) Pause(ctx context.Context, name string) (Schedule, error) {
	return c.Update(ctx, name, func(s *Schedule) { s.Paused = true })
}

// Resume points schedule name at its first tick from now: the ticks that
// passed while it was paused do not fire.
func (c *Client) Resume(ctx context.Context, name string) (Schedule, error) {
	return c.Update(ctx, name, func(s *Schedule) { s.Paused = false })
}

// Delete removes schedule name, its next fire and its history. The tasks
// it submitted stay.
func (c *Client) Delete(ctx context.Context, name string) error {
	for attempt := 0; attempt < 20; attempt++ {
		r, rev, err := c.read(ctx, name)
		if errors.Is(err, errCorrupt) {
			r, err = &record{}, nil // its due item, if any, drops when due
		}
		if err != nil {
			return err
		}
		key := c.keys.Schedule(name)
		ops := []clientv3.Op{clientv3.OpDelete(key), clientv3.OpDelete(c.keys.ScheduleHistory(name), clientv3.WithPrefix())}
		if r.Due != "" {
			ops = append(ops, clientv3.OpDelete(r.Due))
		}
		resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("schedule: delete %s: %w", name, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("schedule: delete %s: it kept changing; try again", name)
}

// Fire is one record of a schedule's history.
type Fire struct {
	// NominalTime is the tick's time (a trigger's: when it was asked).
	NominalTime time.Time `json:"nominal_time"`
	// SubmittedAt is when its task was submitted; zero if none was.
	SubmittedAt time.Time `json:"submitted_at,omitzero"`
	TaskID      string    `json:"task_id,omitempty"`
	// Outcome is the task's state when the history is read (PENDING,
	// RUNNING, SUCCEEDED, ...), or SKIPPED (overlap), MISSED (ticks
	// that passed without a fire: Count of them), REJECTED (the queue
	// refused the task: the reason follows), REMOVED (the task is gone
	// after its retention), STOPPED (its timing no longer reads: the
	// reason follows; it fires again once updated).
	Outcome string `json:"outcome"`
	// Manual marks a trigger's fire.
	Manual bool `json:"manual,omitempty"`
	// Count is, for MISSED, how many ticks passed without a fire, from
	// NominalTime to LastTime (the catch-up policy passed over them, or
	// overlap buffer-one dropped them while it held a tick).
	Count    int       `json:"count,omitempty"`
	LastTime time.Time `json:"last_time,omitzero"`
	Seq      int       `json:"seq"`
}

// The outcomes a fire stores; the others are task states.
const (
	outSubmitted = "SUBMITTED"
	outSkipped   = "SKIPPED"
	outMissed    = "MISSED"
	outStopped   = "STOPPED"
	outRejected  = "REJECTED"
	outRemoved   = "REMOVED"
)

// historyOp writes fire f as the record's next history slot.
func (c *Client) historyOp(r *record, f Fire) clientv3.Op {
	r.Seq++
	f.Seq = r.Seq
	if !f.Manual {
		r.Fired = later(r.Fired, later(f.NominalTime, f.LastTime))
	}
	b, _ := json.Marshal(f)
	return clientv3.OpPut(c.keys.ScheduleHistorySlot(r.Spec.Name, r.Seq%MaxHistory), string(b))
}

// Trigger fires schedule name once now, whatever its ticks and overlap
// policy, paused or not: a task of its own id.
func (c *Client) Trigger(ctx context.Context, name string) (Fire, error) {
	r, _, err := c.read(ctx, name)
	if err != nil {
		return Fire{}, err
	}
	now := c.now().UTC()
	f := Fire{NominalTime: now, TaskID: manualID(name, now), Manual: true}
	f.SubmittedAt, f.Outcome, err = c.submit(ctx, &r.Spec, f.TaskID)
	if err != nil {
		return Fire{}, err
	}
	_, err = c.change(ctx, name, func(r *record) ([]clientv3.Op, error) {
		if f.Outcome == outSubmitted {
			r.Last = f.TaskID
		}
		return []clientv3.Op{c.historyOp(r, f)}, nil
	})
	return f, err
}

// submit submits the task of spec s with id: its outcome is SUBMITTED
// (or a duplicate, the same) or REJECTED with the reason; an error means
// try again.
func (c *Client) submit(ctx context.Context, s *Schedule, id string) (time.Time, string, error) {
	t := queue.Task{ID: id, Type: s.Type, Parameters: s.Params}
	res, err := c.queue.Submit(ctx, s.Queue, []queue.Task{t}, nil)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("schedule: submit %s to %s: %w", id, s.Queue, err)
	}
	if len(res.Rejected) > 0 {
		// A task of this id with other content (the schedule changed
		// since a fire that crashed before its move) is this tick's.
		if _, err := c.queue.Get(ctx, id); err == nil {
			return c.now().UTC(), outSubmitted, nil
		}
		return time.Time{}, outRejected + ": " + res.Rejected[0].Error, nil
	}
	return c.now().UTC(), outSubmitted, nil
}

// History returns schedule name's latest fires, newest first, at most
// limit (0: 100; at most MaxHistory), each with its task's outcome now.
func (c *Client) History(ctx context.Context, name string, limit int) ([]Fire, error) {
	if _, _, err := c.read(ctx, name); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, MaxHistory)
	g, err := c.cli.Get(ctx, c.keys.ScheduleHistory(name), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("schedule: history of %s: %w", name, err)
	}
	fires := make([]Fire, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		var f Fire
		if json.Unmarshal(kv.Value, &f) == nil {
			fires = append(fires, f)
		}
	}
	sort.Slice(fires, func(i, j int) bool { return fires[i].Seq > fires[j].Seq })
	if len(fires) > limit {
		fires = fires[:limit]
	}
	for i := range fires {
		f := &fires[i]
		if f.TaskID == "" || (f.Outcome != outSubmitted && f.Outcome != outSkipped) {
			continue
		}
		t, err := c.queue.Get(ctx, f.TaskID)
		switch {
		case err == nil:
			f.Outcome = string(t.CurrentStatus)
		case errors.Is(err, queue.ErrNotFound) && f.Outcome == outSubmitted:
			f.Outcome = outRemoved
		case errors.Is(err, queue.ErrNotFound):
		default:
			return nil, fmt.Errorf("schedule: history of %s: %w", name, err)
		}
	}
	return fires, nil
}
