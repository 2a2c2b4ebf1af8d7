package queue

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
)

// Status is a task's state.
type Status string

// The states of a task. SUCCEEDED, DEAD and CANCELLED are terminal.
const (
	Pending   Status = "PENDING"
	Running   Status = "RUNNING"
	Succeeded Status = "SUCCEEDED"
	Retrying  Status = "RETRYING"
	Dead      Status = "DEAD"
	Cancelled Status = "CANCELLED"
)

// Limits and defaults.
const (
	DefaultMaxRetries = 3
	MaxMaxRetries     = 100
	MaxPriority       = 1000
	// MaxPayload bounds a task's encoded parameters and metadata.
	MaxPayload = 64 << 10
	// MaxResult bounds a task's stored result.
	MaxResult = 256 << 10
	// MaxHistory bounds the transitions and errors kept per task.
	MaxHistory = 50
)

// Metadata is seed 001's task metadata.
type Metadata struct {
	CreatedAt    time.Time `json:"created_at"`
	Priority     int       `json:"priority"`
	SourceSystem string    `json:"source_system,omitempty"`
	Tenant       string    `json:"tenant,omitempty"`
}

// Transition records one change of state.
type Transition struct {
	Status  Status    `json:"status"`
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt,omitempty"`
	Worker  string    `json:"worker,omitempty"`
	Error   string    `json:"error,omitempty"`
}

// Task is seed 001's task model plus what drover needs to run it.
type Task struct {
	ID            string          `json:"task_id"`
	Type          string          `json:"task_type"`
	InputDataURI  string          `json:"input_data_uri,omitempty"`
	OutputDataURI string          `json:"output_data_uri,omitempty"`
	Parameters    json.RawMessage `json:"parameters,omitempty"`
	Metadata      Metadata        `json:"metadata"`
	// CurrentStatus is the task's state when it was read.
	CurrentStatus Status `json:"current_status"`
	// RetriesAttempted counts the attempts after the first that have run.
	RetriesAttempted int    `json:"retries_attempted"`
	MaxRetries       *int   `json:"max_retries,omitempty"`
	LastError        string `json:"last_error,omitempty"`

	Queue string `json:"queue"`
	// Attempt is the number of the current or last attempt (1-based).
	Attempt int `json:"attempt"`
	// Token is the fencing token of the current attempt's claim.
	Token int64 `json:"token,omitempty"`
	// Timeout bounds one attempt; 0 means the worker's default.
	Timeout Duration `json:"timeout,omitempty"`
	// BackoffBase and BackoffMax override the worker's retry backoff.
	BackoffBase Duration  `json:"backoff_base,omitempty"`
	BackoffMax  Duration  `json:"backoff_max,omitempty"`
	Result      []byte    `json:"result,omitempty"`
	ScheduledAt time.Time `json:"scheduled_at,omitzero"`
	// Deferrals counts the times in a row flow control handed the task
	// back without running it; each doubles the next delay.
	Deferrals int `json:"deferrals,omitempty"`
	// Shard is the pending index shard the task was submitted to when it
	// is not the one its id hashes to (a FIFO queue's tasks are all in
	// shard 0); nil otherwise.
	Shard       *int         `json:"shard,omitempty"`
	Transitions []Transition `json:"transitions,omitempty"`

	// Revisions seen by the read that returned the task, so that writes
	// based on it can require that nothing changed since.
	rev        int64 // the record's ModRevision
	pendingRev int64 // the pending key's ModRevision; 0 when absent
}

// Retries returns the task's retry budget.
func (t *Task) Retries() int {
	if t.MaxRetries == nil {
		return DefaultMaxRetries
	}
	return *t.MaxRetries
}

// Duration is a time.Duration that reads and writes JSON as "1.5s" (or a
// number of seconds).
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return errors.New(`a duration must be a string such as "30s" or a number of seconds`)
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}

// NewID returns a random task id.
func NewID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CheckQueue returns a drover.InputError unless q is a valid queue name.
func CheckQueue(q string) error { return keyspace.CheckName("queue", q) }

// check validates a task before submission and fills in defaults.
func (t *Task) check(now time.Time) error {
	if t.ID == "" {
		return &drover.InputError{Field: "task_id", Rule: "is required"}
	}
	if err := keyspace.CheckName("task_id", t.ID); err != nil {
		return err
	}
	if len(t.ID) > 120 {
		return &drover.InputError{Field: "task_id", Value: t.ID, Rule: "must be at most 120 characters"}
	}
	if err := keyspace.CheckName("task_type", t.Type); err != nil {
		return err
	}
	if t.MaxRetries != nil && (*t.MaxRetries < 0 || *t.MaxRetries > MaxMaxRetries) {
		return &drover.InputError{Field: "max_retries", Value: *t.MaxRetries, Rule: fmt.Sprintf("must be between 0 and %d", MaxMaxRetries)}
	}
	if p := t.Metadata.Priority; p < 0 || p > MaxPriority {
		return &drover.InputError{Field: "metadata.priority", Value: p, Rule: fmt.Sprintf("must be between 0 and %d", MaxPriority)}
	}
	if len(t.Parameters) > 0 && !json.Valid(t.Parameters) {
		return &drover.InputError{Field: "parameters", Rule: "must be valid JSON"}
	}
	if t.Timeout < 0 || t.BackoffBase < 0 || t.BackoffMax < 0 {
		return &drover.InputError{Field: "timeout/backoff", Rule: "must not be negative"}
	}
	size := len(t.Parameters) + len(t.InputDataURI) + len(t.OutputDataURI) + len(t.Metadata.SourceSystem) + len(t.Metadata.Tenant)
	if size > MaxPayload {
		return &drover.InputError{Field: "parameters", Value: fmt.Sprintf("%d bytes", size),
			Rule: fmt.Sprintf("a task's payload must be at most %d bytes: put large inputs behind input_data_uri", MaxPayload)}
	}
	if t.Metadata.CreatedAt.IsZero() {
		t.Metadata.CreatedAt = now.UTC()
	}
	return nil
}

// LineError is a line of a JSONL batch that is not a valid task.
type LineError struct {
	Line  int    `json:"line"`
	Error string `json:"error"`
}

// ParseLine reads one JSONL line as a task. Unknown fields are refused so
// that a misspelt field does not pass silently.
func ParseLine(line []byte) (Task, error) {
	var t Task
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return Task{}, describeJSONError(err)
	}
	if dec.More() {
		return Task{}, errors.New("more than one JSON value on the line")
	}
	if t.ID == "" {
		return Task{}, errors.New("task_id is required: it makes submitting the same file twice safe")
	}
	if t.CurrentStatus != "" || t.Attempt != 0 || t.Token != 0 || len(t.Transitions) > 0 || t.Result != nil || t.RetriesAttempted != 0 {
		return Task{}, errors.New("current_status, attempt, token, transitions, result and retries_attempted are set by drover, not by submitters")
	}
	return t, nil
}

func describeJSONError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		return fmt.Errorf("field %s: must be %s, not JSON %s", te.Field, te.Type, te.Value)
	case errors.As(err, &se):
		return fmt.Errorf("malformed JSON at byte %d: %v", se.Offset, err)
	}
	return fmt.Errorf("malformed task: %w", err)
}
