package queue

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
	"github.com/droverhq/drover/tracing/otelspan"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	// Scheduled is a task submitted to run later (RunAt or Delay) whose
	// time has not come: no worker claims it before.
	Scheduled Status = "SCHEDULED"
	// Sleeping is a step task parked until the sleep its last step ended
	// with is over: it holds no claim, and no worker claims it before.
	Sleeping Status = "SLEEPING"
	// Waiting is a step task parked until what its last step waits for
	// (a signal) comes, or the wait times out: it holds no claim, and no
	// worker claims it before.
	Waiting Status = "WAITING"
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
	// MaxDelayYears bounds how far ahead a task's run_at may be.
	MaxDelayYears = 100
)

// Metadata is a task's metadata: when it was created, its priority (higher
// first), the system it came from, the tenant it is for, and the LLM
// budget it spends (package budget): a worker's budget gate reserves
// EstimatedTokens of Budget for Tenant before the task runs, and defers
// the task, uncharged, while the budget has no room.
type Metadata struct {
	CreatedAt       time.Time `json:"created_at"`
	Priority        int       `json:"priority"`
	SourceSystem    string    `json:"source_system,omitempty"`
	Tenant          string    `json:"tenant,omitempty"`
	Budget          string    `json:"budget,omitempty"`
	EstimatedTokens int64     `json:"estimated_tokens,omitempty"`
}

// MaxEstimatedTokens bounds a task's metadata.estimated_tokens.
const MaxEstimatedTokens = 1_000_000_000

// checkBudget checks the budget a task names and its estimate.
func (m Metadata) checkBudget() error {
	if m.EstimatedTokens < 0 || m.EstimatedTokens > MaxEstimatedTokens {
		return &drover.InputError{Field: "metadata.estimated_tokens", Value: m.EstimatedTokens, Rule: fmt.Sprintf("must be between 0 and %d", MaxEstimatedTokens)}
	}
	if m.Budget == "" {
		if m.EstimatedTokens > 0 {
			return &drover.InputError{Field: "metadata.budget", Rule: "must name the budget that metadata.estimated_tokens are reserved from"}
		}
		return nil
	}
	return keyspace.CheckBudgetKey("metadata.budget", m.Budget)
}

// Transition records one change of state.
type Transition struct {
	Status  Status    `json:"status"`
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt,omitempty"`
	Worker  string    `json:"worker,omitempty"`
	Error   string    `json:"error,omitempty"`
}

// Task is a queued task: what its submitter gives (id, type, data URIs,
// parameters, metadata, retry budget) and what drover adds to run it.
type Task struct {
	ID            string          `json:"task_id"`
	Type          string          `json:"task_type"`
	InputDataURI  string          `json:"input_data_uri,omitempty"`
	OutputDataURI string          `json:"output_data_uri,omitempty"`
	Parameters    json.RawMessage `json:"parameters,omitempty"`
	Metadata      Metadata        `json:"metadata"`
	// TraceParent is the W3C traceparent of the submission: the context
	// of the span that sent the task (package tracing), which each
	// attempt's span continues and links to. Submit fills it from its
	// context when it holds a valid span context and the task gives none;
	// "" otherwise.
	TraceParent string `json:"traceparent,omitempty"`
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
	// RunAt, given on submission, is when the task falls due: until then
	// it is SCHEDULED and no worker claims it. A time in the past means
	// now. Delay is the same as a duration from the submission; give one
	// or neither. Neither is stored as given: a scheduled task's
	// ScheduledAt says when it falls due (tasks submitted together and
	// due within DueGroup of each other fall due together, at the latest
	// of their times).
	RunAt time.Time `json:"run_at,omitzero"`
	Delay Duration  `json:"delay,omitempty"`
	// Deferrals counts the times in a row flow control handed the task
	// back without running it; each doubles the next delay.
	Deferrals int `json:"deferrals,omitempty"`
	// Shard is the pending index shard the task was submitted to when it
	// is not the one its id hashes to (a FIFO queue's tasks are all in
	// shard 0); nil otherwise.
	Shard *int `json:"shard,omitempty"`
	// WaitingFor is what a WAITING task waits for (its record keeps it
	// until the task's next outcome); nil for a task that does not wait.
	WaitingFor  *WaitingFor  `json:"waiting_for,omitempty"`
	Transitions []Transition `json:"transitions,omitempty"`
	// Parent is the step task that spawned this one (see task.Spawn), and
	// ParentStep the step of it that did; "" and 0 for a task submitted
	// otherwise. A child's terminal outcome is recorded for its parent.
	Parent     string `json:"parent,omitempty"`
	ParentStep int    `json:"parent_step,omitempty"`
	// ParentQueue is the parent's queue, whose workers wake it.
	ParentQueue string `json:"parent_queue,omitempty"`
	// StreamSettled: the transaction that stored the task's end also
	// settled its stream: its done was written with it, or none comes
	// (EndsStream then ends a follower at once).
	StreamSettled bool `json:"stream_settled,omitempty"`

	// Revisions seen by the read that returned the task, so that writes
	// based on it can require that nothing changed since.
	rev        int64 // the record's ModRevision
	pendingRev int64 // the pending key's ModRevision; 0 when absent
	// seg is where a task read from its segment is; nil for a task with a
	// record of its own.
	seg *segRef
	// resumes is the wait the record of a task not WAITING keeps, which
	// its next claim resumes at (WaitingFor shows only a WAITING task's):
	// a rewrite of the record (Requeue) keeps it.
	resumes *WaitingFor
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
	// A *json.UnmarshalTypeError gets the field's name from the decoder.
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return &json.UnmarshalTypeError{Value: fmt.Sprintf("string %q", s), Type: reflect.TypeFor[Duration]()}
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		kind := "object"
		switch {
		case len(b) > 0 && b[0] == '[':
			kind = "array"
		case bytes.Equal(b, []byte("true")) || bytes.Equal(b, []byte("false")):
			kind = "bool"
		}
		return &json.UnmarshalTypeError{Value: kind, Type: reflect.TypeFor[Duration]()}
	}
	if math.IsNaN(secs) || math.Abs(secs) >= math.MaxInt64/float64(time.Second) {
		// Past about 292 years the nanoseconds overflow (and flip sign).
		return &json.UnmarshalTypeError{Value: fmt.Sprintf("number %s (seconds, beyond about 292 years)", b), Type: reflect.TypeFor[Duration]()}
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
	if err := keyspace.CheckName("task_type", t.Type); err != nil {
		return err
	}
	if t.MaxRetries != nil && (*t.MaxRetries < 0 || *t.MaxRetries > MaxMaxRetries) {
		return &drover.InputError{Field: "max_retries", Value: *t.MaxRetries, Rule: fmt.Sprintf("must be between 0 and %d", MaxMaxRetries)}
	}
	if p := t.Metadata.Priority; p < 0 || p > MaxPriority {
		return &drover.InputError{Field: "metadata.priority", Value: p, Rule: fmt.Sprintf("must be between 0 and %d", MaxPriority)}
	}
	if err := t.Metadata.checkBudget(); err != nil {
		return err
	}
	if len(t.Parameters) > 0 && !json.Valid(t.Parameters) {
		return &drover.InputError{Field: "parameters", Rule: "must be valid JSON"}
	}
	if err := t.checkUTF8(); err != nil {
		return err
	}
	if _, ok := otelspan.Parse(t.TraceParent); t.TraceParent != "" && !ok {
		return &drover.InputError{Field: "traceparent", Value: t.TraceParent, Rule: "must be a W3C traceparent: 00-<32 hex digits>-<16 hex digits>-<2 hex digits>, in lower case"}
	}
	if t.Timeout < 0 || t.BackoffBase < 0 || t.BackoffMax < 0 {
		return &drover.InputError{Field: "timeout/backoff", Rule: "must not be negative"}
	}
	size := len(t.Parameters) + len(t.InputDataURI) + len(t.OutputDataURI) + len(t.Metadata.SourceSystem) + len(t.Metadata.Tenant)
	if size > MaxPayload {
		return &drover.InputError{Field: "parameters", Value: fmt.Sprintf("%d bytes", size),
			Rule: fmt.Sprintf("a task's payload must be at most %d bytes: put large inputs behind input_data_uri", MaxPayload)}
	}
	if err := t.checkDue(now); err != nil {
		return err
	}
	if t.Metadata.CreatedAt.IsZero() {
		t.Metadata.CreatedAt = now.UTC()
	}
	return nil
}

// checkDue checks RunAt and Delay and turns them into RunAt alone: zero
// when the task is due at once.
func (t *Task) checkDue(now time.Time) error {
	switch {
	case !t.RunAt.IsZero() && t.Delay != 0:
		return &drover.InputError{Field: "run_at", Rule: "give run_at or delay, not both"}
	case t.Delay < 0:
		return &drover.InputError{Field: "delay", Value: time.Duration(t.Delay).String(), Rule: "must not be negative"}
	}
	field := "run_at"
	if t.Delay > 0 {
		t.RunAt, field = now.Add(time.Duration(t.Delay)), "delay"
	}
	if t.RunAt.After(now.AddDate(MaxDelayYears, 0, 0)) {
		return &drover.InputError{Field: field, Rule: fmt.Sprintf("must be at most %d years from now", MaxDelayYears)}
	}
	t.Delay = 0
	if !t.RunAt.After(now) {
		t.RunAt = time.Time{} // due now
	}
	if !t.RunAt.IsZero() {
		t.RunAt = t.RunAt.UTC()
	}
	return nil
}

// Validate reports the first field of t that a submission would reject, as
// a *drover.InputError naming it; t is not changed.
func (t *Task) Validate() error {
	c := *t
	if c.ID == "" {
		c.ID = "x" // a submission gives it one
	}
	return c.check(time.Now())
}

// checkUTF8 rejects text that is not UTF-8: it would be stored as it is and
// given back as JSON that other languages cannot decode.
func (t *Task) checkUTF8() error {
	for _, f := range []struct{ name, value string }{
		{"input_data_uri", t.InputDataURI}, {"output_data_uri", t.OutputDataURI},
		{"metadata.source_system", t.Metadata.SourceSystem}, {"metadata.tenant", t.Metadata.Tenant},
		{"parameters", string(t.Parameters)},
	} {
		if !utf8.ValidString(f.value) {
			return &drover.InputError{Field: f.name, Rule: "must be UTF-8 text: it holds bytes that are not"}
		}
	}
	return nil
}

// LineError is a line of a JSONL batch that is not a valid task.
type LineError struct {
	Line  int    `json:"line"`
	Error string `json:"error"`
}

// ParseLine reads one JSONL line as a task. Unknown fields are refused so
// that a misspelt field does not pass silently, and so is a line that is not
// UTF-8 text.
func ParseLine(line []byte) (Task, error) {
	if !utf8.Valid(line) {
		at := 0
		for at < len(line) {
			r, n := utf8.DecodeRune(line[at:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			at += n
		}
		return Task{}, fmt.Errorf("not UTF-8 text: invalid bytes at byte %d of the line", at+1)
	}
	var t Task
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		if errors.As(err, new(*time.ParseError)) {
			return Task{}, fmt.Errorf("field %s: must be an RFC 3339 time such as \"2026-12-01T09:00:00Z\": %w", timeField(line), err)
		}
		return Task{}, describeJSONError(err)
	}
	if dec.More() {
		return Task{}, errors.New("more than one JSON value on the line")
	}
	if t.ID == "" {
		return Task{}, errors.New("task_id is required: it makes submitting the same file twice safe")
	}
	if t.CurrentStatus != "" || t.Attempt != 0 || t.Token != 0 || len(t.Transitions) > 0 || t.Result != nil || t.RetriesAttempted != 0 || t.WaitingFor != nil || t.StreamSettled {
		return Task{}, errors.New("current_status, attempt, token, transitions, result, retries_attempted, waiting_for and stream_settled are set by drover, not by submitters")
	}
	if t.Parent != "" || t.ParentStep != 0 || t.ParentQueue != "" {
		return Task{}, errors.New("parent, parent_step and parent_queue are set by drover when a step spawns a child task, not by submitters")
	}
	return t, nil
}

// timeField names the time field of a task line that does not read:
// run_at, scheduled_at, else metadata.created_at.
func timeField(line []byte) string {
	var v struct {
		RunAt       json.RawMessage `json:"run_at"`
		ScheduledAt json.RawMessage `json:"scheduled_at"`
	}
	if json.Unmarshal(line, &v) != nil {
		return "metadata.created_at"
	}
	var at time.Time
	switch {
	case len(v.RunAt) > 0 && json.Unmarshal(v.RunAt, &at) != nil:
		return "run_at"
	case len(v.ScheduledAt) > 0 && json.Unmarshal(v.ScheduledAt, &at) != nil:
		return "scheduled_at"
	}
	return "metadata.created_at"
}

func describeJSONError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field == "":
		return fmt.Errorf("a task must be a JSON object, not %s", jsonKind(te.Value))
	case errors.As(err, &te):
		return fmt.Errorf("field %s: must be %s, not %s", te.Field, jsonWant(te.Type), jsonKind(te.Value))
	case errors.As(err, &se):
		return fmt.Errorf("malformed JSON at byte %d: %v", se.Offset, err)
	}
	return fmt.Errorf("malformed task: %w", err)
}

// jsonWant says in JSON's words what a value of Go type t must be.
func jsonWant(t reflect.Type) string {
	if t == reflect.TypeFor[Duration]() {
		return `a duration such as "30s", or a number of seconds`
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Pointer:
		return jsonWant(t.Elem())
	}
	return "an object"
}

// jsonKind names a JSON value's kind as encoding/json reports it ("array",
// "number 1.5", ...), with an article.
func jsonKind(v string) string {
	switch {
	case v == "array", v == "object":
		return "an " + v
	case v == "":
		return "that value"
	}
	return "a " + v
}

// View is how a task is shown to people and programs (drover tasks get
// --json, and every listing): the task as it is stored, except its result,
// which is a JSON value: the result itself when it is JSON, a JSON string
// when it is other UTF-8 text. A result of other bytes is in ResultBase64
// instead.
type View struct {
	*Task
	Result       json.RawMessage `json:"result,omitempty"`
	ResultBase64 []byte          `json:"result_base64,omitempty"`
	// Signals are the signals the task received (Client.Signals), when
	// the reader asked for them.
	Signals []task.SignalRecord `json:"signals,omitempty"`
}

// NewView returns the view of t.
func NewView(t *Task) View {
	v := View{Task: t}
	switch r := t.Result; {
	case len(r) == 0:
	case json.Valid(r):
		v.Result = r
	case utf8.Valid(r):
		v.Result, _ = json.Marshal(string(r))
	default:
		v.ResultBase64 = r
	}
	return v
}

// Wait blocks until task id is SUCCEEDED, DEAD or CANCELLED and returns it,
// or until ctx ends. It watches the task's record, which every terminal
// outcome rewrites, so it does not poll.
func (c *Client) Wait(ctx context.Context, id string) (*Task, error) {
	var compacted int64 // the watch may not start before this revision
	for {
		t, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if t.CurrentStatus.Terminal() {
			return t, nil
		}
		if t.seg != nil {
			from := max(t.seg.rev+1, compacted)
			compacted, err = c.waitSegment(ctx, id, t.seg, from)
		} else {
			from := max(t.rev+1, compacted)
			compacted, err = c.waitRecord(ctx, id, from)
		}
		if err != nil {
			return t, fmt.Errorf("queue: wait for task %s (last %s): %w", id, t.CurrentStatus, err)
		}
	}
}

// waitRecord returns once task id's record changed at or after revision
// from, or the watch broke (the caller reads again), or with ctx's error. A
// watch refused because from was compacted away returns the compaction
// revision, from which the next watch starts (the caller's read covers what
// came before).
func (c *Client) waitRecord(ctx context.Context, id string, from int64) (int64, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return waitChange(ctx, c.cli.Watch(clientv3.WithRequireLeader(wctx), c.keys.TaskRecord(id), clientv3.WithRev(from)))
}

// waitSegment is waitRecord for a task in a segment: it ends when an
// outcome or an exit is written in the task's segment (the task's own or
// another's: the caller reads again), or the task's index key changes (a
// purge removed it).
func (c *Client) waitSegment(ctx context.Context, id string, at *segRef, from int64) (int64, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := func(key string, opts ...clientv3.OpOption) clientv3.WatchChan {
		return c.cli.Watch(clientv3.WithRequireLeader(wctx), key, append(opts, clientv3.WithRev(from))...)
	}
	return waitChange(ctx, watch(c.keys.Outs(at.queue, at.seg), clientv3.WithPrefix()),
		watch(c.keys.Exits(at.queue, at.seg), clientv3.WithPrefix()), watch(c.keys.TaskIndex(id)))
}

// waitChange returns once one of the watches reports a change or breaks;
// see waitRecord.
func waitChange(ctx context.Context, watches ...clientv3.WatchChan) (int64, error) {
	merged := make(chan clientv3.WatchResponse, len(watches))
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	for _, wch := range watches {
		go func() {
			for {
				var wr clientv3.WatchResponse
				select {
				case r, ok := <-wch:
					if ok && r.Err() == nil && r.CompactRevision == 0 && len(r.Events) == 0 {
						continue // nothing happened yet
					}
					wr = r
				case <-fctx.Done():
					return
				}
				select {
				case merged <- wr:
				case <-fctx.Done():
				}
				return
			}
		}()
	}
	select {
	case wr := <-merged:
		if wr.CompactRevision > 0 {
			return wr.CompactRevision, nil
		}
		return 0, ctx.Err()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// childTask is child c of step step of task parent, of queue pq, as it is
// submitted.
func childTask(c task.Child, parent string, step int, pq string) Task {
	return Task{ID: c.ID, Type: c.Type, Parameters: c.Parameters, Metadata: Metadata{Priority: c.Priority},
		MaxRetries: c.MaxRetries, Timeout: Duration(c.Timeout), Queue: c.Queue, Parent: parent, ParentStep: step, ParentQueue: pq}
}
