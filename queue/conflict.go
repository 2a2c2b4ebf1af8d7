package queue

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
)

// submitted is where a valid task of a submission came from: its 1-based
// position, and whether the submitter gave its created_at.
type submitted struct {
	line  int
	dated bool
}

// sameStored returns nil when stored (the task read back when a task's id
// already existed; nil when it was gone by then) is the same task as t,
// which makes t a duplicate; otherwise an error that names where the id is
// taken. A task id is unique across queues, for as long as its task is
// kept.
func sameStored(stored *Task, t *Task, dated bool) error {
	if stored == nil {
		// The task went between the failed compare and the read: it
		// was removed after its retention, in the same instant.
		return fmt.Errorf("task_id %s was taken a moment ago and has just been removed; submit it again", t.ID)
	}
	return sameTask(stored, t, dated)
}

// sameTask compares what a submitter gives of a task: queue, type, data
// URIs, parameters (as JSON values, so key order and spacing do not
// matter), metadata, retry budget, timeout and backoff. created_at counts
// only when the later submission gave it (otherwise it is the time of
// submission, which differs on every try).
func sameTask(old, t *Task, dated bool) error {
	if old.Queue != t.Queue {
		return fmt.Errorf("task_id %s already exists in queue %s; task ids are unique across queues: choose another task_id", t.ID, old.Queue)
	}
	same := old.Type == t.Type && old.InputDataURI == t.InputDataURI && old.OutputDataURI == t.OutputDataURI &&
		sameJSON(old.Parameters, t.Parameters) &&
		old.Metadata.Priority == t.Metadata.Priority && old.Metadata.SourceSystem == t.Metadata.SourceSystem &&
		old.Metadata.Tenant == t.Metadata.Tenant && (!dated || old.Metadata.CreatedAt.Equal(t.Metadata.CreatedAt)) &&
		old.Retries() == t.Retries() && old.Timeout == t.Timeout && old.BackoffBase == t.BackoffBase && old.BackoffMax == t.BackoffMax
	if !same {
		return fmt.Errorf("task_id %s already exists in queue %s with different content; choose another task_id, or submit the same content to have it counted as a duplicate", t.ID, old.Queue)
	}
	return nil
}

// sameJSON reports whether a and b hold the same JSON value (absent and
// null are the same).
func sameJSON(a, b json.RawMessage) bool {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	if len(a) > 0 && json.Unmarshal(a, &va) != nil || len(b) > 0 && json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// SortLineErrors orders rejected lines by line number.
func SortLineErrors(r []LineError) {
	sort.Slice(r, func(i, j int) bool { return r[i].Line < r[j].Line })
}
