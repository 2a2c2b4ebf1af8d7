package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxWaitSignals bounds how many signal names one wait may list.
const MaxWaitSignals = 16

// WaitRequest is what a step returns as its error to wait for a signal:
// the state it returns with it is checkpointed as the step's, with what
// the task waits for, and the next step runs once one of the signals
// named arrives (it gets the signal, see ReceivedSignal) or once the
// timeout passes (it gets a Signal with TimedOut set). Make one with
// WaitSignal or WaitSignals.
//
// From a queue (queue.Steps) the task is parked as a sleeping task is:
// WAITING, with no claim, no lease and no worker slot, until a signal
// wakes it (queue.Client.Signal) or its timeout moves it back to pending;
// then any worker resumes it at the next step. A Runner (named tasks, no
// queue) cannot park: Run returns with Result.Waiting set and the lock
// released, and a Run after that delivers the signal if one arrived and
// otherwise returns the same way, running nothing. A wait from the last
// step ends nothing: the task completes at once.
type WaitRequest struct {
	// Signals are the names waited for; the first of them sent (in the
	// order they were sent) ends the wait.
	Signals []string
	// Timeout, when positive, ends the wait with no signal that long
	// after the step ended; 0 waits without end.
	Timeout time.Duration
}

// WaitSignal ends a step with a wait for the signal name, for at most
// timeout (0: no timeout).
func WaitSignal(name string, timeout time.Duration) error {
	return &WaitRequest{Signals: []string{name}, Timeout: timeout}
}

// WaitSignals ends a step with a wait for the first of the signals names,
// for at most timeout (0: no timeout).
func WaitSignals(timeout time.Duration, names ...string) error {
	return &WaitRequest{Signals: names, Timeout: timeout}
}

// Error implements error: a wait request that reaches a caller which does
// not park tasks reads as what it is.
func (r *WaitRequest) Error() string {
	s := "task: step asks to wait for signal " + strings.Join(r.Signals, " or ")
	if r.Timeout > 0 {
		s += " for at most " + r.Timeout.String()
	}
	return s
}

// Check returns a *drover.InputError unless the request is usable: one to
// MaxWaitSignals distinct valid names, and a timeout that is not negative
// and ends within MaxSleepYears.
func (r *WaitRequest) Check() error {
	if len(r.Signals) == 0 || len(r.Signals) > MaxWaitSignals {
		return &drover.InputError{Field: "wait signals", Value: len(r.Signals), Rule: fmt.Sprintf("must name 1 to %d signals", MaxWaitSignals)}
	}
	seen := map[string]bool{}
	for _, n := range r.Signals {
		if err := CheckSignalName(n); err != nil {
			return err
		}
		if seen[n] {
			return &drover.InputError{Field: "signal name", Value: n, Rule: "must be listed once"}
		}
		seen[n] = true
	}
	if r.Timeout < 0 {
		return &drover.InputError{Field: "wait timeout", Value: r.Timeout.String(), Rule: "must not be negative (0 means no timeout)"}
	}
	if r.Timeout > time.Duration(MaxSleepYears)*365*24*time.Hour {
		return &drover.InputError{Field: "wait timeout", Value: r.Timeout.String(), Rule: fmt.Sprintf("must end at most %d years from now", MaxSleepYears)}
	}
	return nil
}

// ParseWaitText reads a wait as text, as an exec step writes it to its
// DROVER_WAIT_FILE: signal names separated by commas, then, optionally,
// a timeout (a duration such as 24h, or a number of seconds), such as
// "approval 24h". field names the input in the error (a
// *drover.InputError); the request returned is checked.
func ParseWaitText(field, text string) (*WaitRequest, error) {
	f := strings.Fields(text)
	if len(f) == 0 || len(f) > 2 {
		return nil, &drover.InputError{Field: field, Value: text, Rule: "must be NAME[,NAME...] [TIMEOUT], such as \"approval 24h\""}
	}
	req := &WaitRequest{Signals: strings.Split(f[0], ",")}
	if len(f) == 2 {
		sl, err := ParseSleep(field, f[1])
		if err == nil && !sl.Until.IsZero() {
			err = &drover.InputError{Field: field, Value: f[1], Rule: "the timeout must be a duration such as 24h, or a number of seconds"}
		}
		if err != nil {
			return nil, err
		}
		req.Timeout = sl.For
	}
	if err := req.Check(); err != nil {
		var ie *drover.InputError
		if errors.As(err, &ie) {
			return nil, ie.Renamed(field + " " + ie.Field)
		}
		return nil, err
	}
	return req, nil
}

// CheckSignalName returns a *drover.InputError unless name is a valid
// signal name (the rule of keyspace.CheckName).
func CheckSignalName(name string) error { return keyspace.CheckName("signal name", name) }

// MaxSignalData bounds a signal's data, in bytes of JSON.
const MaxSignalData = 64 << 10

// CheckSignal returns a *drover.InputError unless a signal name, with
// data (JSON, at most MaxSignalData bytes; empty: none) and idempotency
// key idem ("": a random one), is a valid signal to task id.
func CheckSignal(id, name string, data json.RawMessage, idem string) error {
	if err := CheckID(id); err != nil {
		return err
	}
	if err := CheckSignalName(name); err != nil {
		return err
	}
	if idem != "" {
		if err := CheckIdempotencyKey(idem); err != nil {
			return err
		}
	}
	if len(data) > MaxSignalData {
		return &drover.InputError{Field: "data", Value: len(data), Rule: fmt.Sprintf("must be at most %d bytes of JSON", MaxSignalData)}
	}
	if len(data) > 0 && !json.Valid(data) {
		return &drover.InputError{Field: "data", Rule: "must be JSON"}
	}
	return nil
}

// CheckIdempotencyKey returns a *drover.InputError unless key is a valid
// signal idempotency key (the rule of keyspace.CheckName).
func CheckIdempotencyKey(key string) error { return keyspace.CheckName("idempotency key", key) }

// waitOf returns the wait request err is or wraps, if any.
func waitOf(err error) (*WaitRequest, bool) {
	var r *WaitRequest
	ok := errors.As(err, &r)
	return r, ok
}

// Wait is what a task waits for, as its checkpoint records it.
type Wait struct {
	// Signals are the signal names the task waits for.
	Signals []string `json:"signals,omitempty"`
	// Since is when the wait began (a queued task's record may leave it
	// to its WAITING transition: see Stored).
	Since time.Time `json:"since,omitzero"`
	// Until is when the wait times out; zero: it does not.
	Until time.Time `json:"until,omitzero"`
	// Children, when set, says the task waits for the children a step
	// spawned (see Spawn), not for a signal; the checkpoint's Spawn
	// records it, and this is only what a run reports.
	Children *ChildrenWait `json:"children,omitempty"`
}

// Stored is w as a record keeps it that says elsewhere when the wait
// began (since) and when it times out (until, zero for no timeout): its
// Since left out when it is since, its Until when it is until. Fill
// puts them back.
func (w *Wait) Stored(since, until time.Time) *Wait {
	s := *w
	if s.Since.Equal(since) {
		s.Since = time.Time{}
	}
	if s.Until.Equal(until) {
		s.Until = time.Time{}
	}
	return &s
}

// Fill puts back into a wait read from a record what Stored left out:
// since and until (what the rest of the record says) where w has none.
func (w *Wait) Fill(since, until time.Time) {
	if w.Since.IsZero() {
		w.Since = since
	}
	if w.Until.IsZero() {
		w.Until = until
	}
}

// Begin is the wait r asks for, beginning at now (r checked).
func (r *WaitRequest) Begin(now time.Time) *Wait {
	w := &Wait{Signals: append([]string(nil), r.Signals...), Since: now.UTC()}
	if r.Timeout > 0 {
		w.Until = now.Add(r.Timeout).UTC()
	}
	return w
}

// Signal is what a step resumed after a wait receives through its
// context (ReceivedSignal): the signal that ended the wait, or, with
// TimedOut set, none.
type Signal struct {
	// Name is the signal's name; "" when the wait timed out.
	Name string `json:"name,omitempty"`
	// Data is the JSON the sender gave (nil when none).
	Data json.RawMessage `json:"data,omitempty"`
	// IdempotencyKey is the key the signal was sent with.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// SentAt is when it was sent, on the sender's clock.
	SentAt time.Time `json:"sent_at,omitzero"`
	// TimedOut: the wait's timeout passed with no signal.
	TimedOut bool `json:"timed_out,omitempty"`

	rev int64 // the inbox key's create revision: the order of sending
}

type signalKey struct{}

// ReceivedSignal returns the signal that ended the wait the step before
// the running one asked for: false when the step before did not wait.
// A signal that ends a wait is consumed in the checkpoint of the step it
// was delivered to: a step that fails, or a run that loses its fence
// before its checkpoint, leaves it for the next attempt.
func ReceivedSignal(ctx context.Context) (Signal, bool) {
	s, ok := ctx.Value(signalKey{}).(*Signal)
	if !ok {
		return Signal{}, false
	}
	return *s, true
}

// WithSignal returns ctx carrying s, as ReceivedSignal reads it: for
// steps run outside RunSteps (tests, HTTP step clients' adapters).
func WithSignal(ctx context.Context, s Signal) context.Context {
	return context.WithValue(ctx, signalKey{}, &s)
}

// signalValue is what an inbox key holds.
type signalValue struct {
	Data json.RawMessage `json:"d,omitempty"`
	At   time.Time       `json:"at"`
}

// EncodeSignal is the value of an inbox key: the signal's data and when
// it was sent.
func EncodeSignal(data json.RawMessage, at time.Time) string {
	b, _ := json.Marshal(signalValue{Data: data, At: at.UTC()})
	return string(b)
}

// SignalRecord is one signal a task received, as Signals lists it.
type SignalRecord struct {
	Signal
	// Consumed: a step received it and its checkpoint was written.
	Consumed bool `json:"consumed"`
	// ConsumedAt is when (the tombstone's time).
	ConsumedAt time.Time `json:"consumed_at,omitzero"`
}

// seenValue is what a consumed signal's tombstone holds.
type seenValue struct {
	At   time.Time `json:"at"`
	Sent time.Time `json:"s,omitzero"`
}

// Signals returns the signals task id received: those waiting in its
// inbox, in the order they were sent, then those consumed.
func (s *Store) Signals(ctx context.Context, id string) ([]SignalRecord, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	in, seen := s.keys.TaskSignals(id), s.keys.TaskSignalsSeen(id)
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(in, clientv3.WithPrefix()), clientv3.OpGet(seen, clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, fmt.Errorf("task: signals of %s: %w", id, err)
	}
	inbox := parseInbox(in, resp.Responses[0].GetResponseRange().Kvs)
	out := make([]SignalRecord, 0, len(inbox))
	for _, sg := range inbox {
		out = append(out, SignalRecord{Signal: sg})
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		name, idem, ok := keyspace.ParseTaskSignal(seen, string(kv.Key))
		if !ok {
			continue
		}
		var v seenValue
		_ = json.Unmarshal(kv.Value, &v)
		out = append(out, SignalRecord{Signal: Signal{Name: name, IdempotencyKey: idem, SentAt: v.Sent}, Consumed: true, ConsumedAt: v.At})
	}
	return out, nil
}

// parseInbox reads inbox keys under prefix in the order they were sent.
func parseInbox(prefix string, kvs []*mvccpb.KeyValue) []Signal {
	out := make([]Signal, 0, len(kvs))
	for _, kv := range kvs {
		name, idem, ok := keyspace.ParseTaskSignal(prefix, string(kv.Key))
		if !ok {
			continue
		}
		var v signalValue
		_ = json.Unmarshal(kv.Value, &v)
		out = append(out, Signal{Name: name, IdempotencyKey: idem, Data: v.Data, SentAt: v.At, rev: kv.CreateRevision})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].rev < out[j].rev })
	return out
}

// firstSignalBefore returns the first signal sent, among names, that
// waits in task id's inbox, stored before etcd revision rev (0: any); nil:
// none. It reads the first sent under each name waited
// for (one read of each name's prefix, in one request), not the whole
// inbox.
func (s *Store) firstSignalBefore(ctx context.Context, id string, names []string, rev int64) (*Signal, error) {
	prefix := s.keys.TaskSignals(id)
	ops := make([]clientv3.Op, len(names))
	for i, n := range names {
		ops[i] = clientv3.OpGet(s.keys.TaskSignalName(id, n), clientv3.WithPrefix(), clientv3.WithLimit(1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	}
	g, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("task: read the signals of %s: %w", id, err)
	}
	var kvs []*mvccpb.KeyValue
	for _, r := range g.Responses {
		kvs = append(kvs, r.GetResponseRange().Kvs...)
	}
	sigs := parseInbox(prefix, kvs) // in the order sent
	if len(sigs) == 0 || rev > 0 && sigs[0].rev >= rev {
		return nil, nil // none, or none stored before rev
	}
	return &sigs[0], nil
}

// ClaimSignal is what a claim that holds task id under an etcd fencing
// token (the create revision of its claim) resumes a checkpoint waiting
// for wt with, for clients that run a step apart from its write (HTTP
// agent tasks): the first signal waited for stored before the claim, or,
// with none, a timeout when wt's timeout passed by now; nil: the task
// still waits. The step write after it consumes the same signal
// (CommitSignal with the same token finds it again): a signal stored
// after the claim is left for a later wait, never consumed unseen.
func (s *Store) ClaimSignal(ctx context.Context, id string, wt *Wait, token int64, now time.Time) (*Signal, error) {
	sg, err := s.firstSignalBefore(ctx, id, wt.Signals, token)
	if err != nil || sg != nil {
		return sg, err
	}
	if !wt.Until.IsZero() && !wt.Until.After(now) {
		return &Signal{TimedOut: true}, nil
	}
	return nil, nil
}

// CommitSignal is Commit of the step that follows a wait, resumed with sg
// (from ClaimSignal; nil or a timeout: nothing to consume): the signal is
// consumed in the checkpoint's transaction, fenced as it is.
func (s *Store) CommitSignal(ctx context.Context, f lease.Fence, prev Checkpoint, next *Checkpoint, rec StepRecord, sg *Signal) error {
	return s.commit(ctx, f, prev, next, rec, s.consumeOps(next.TaskID, sg, next.At))
}

// consumeOps are the writes that consume signal sg of task id, made in
// the checkpoint of the step it was delivered to.
func (s *Store) consumeOps(id string, sg *Signal, at time.Time) []clientv3.Op {
	if sg == nil || sg.TimedOut {
		return nil
	}
	v, _ := json.Marshal(seenValue{At: at.UTC(), Sent: sg.SentAt})
	return []clientv3.Op{clientv3.OpDelete(s.keys.TaskSignal(id, sg.Name, sg.IdempotencyKey)),
		clientv3.OpPut(s.keys.TaskSignalSeen(id, sg.Name, sg.IdempotencyKey), string(v))}
}

// ConsumeOps are the writes that consume signal sg of task id at at (none
// for a timeout), for a caller that consumes it in a fenced transaction
// of its own: a plain queue task's outcome (package queue).
func (s *Store) ConsumeOps(id string, sg *Signal, at time.Time) []clientv3.Op {
	return s.consumeOps(id, sg, at)
}

// resumeWait decides what a run that loads a checkpoint waiting for wt
// does: deliver the first signal waiting in the inbox; or, with none,
// let the task go again while its timeout has not passed on now's clock
// (nil, nil: a wake with nothing for it, or a mover whose clock is
// ahead), waiting in-process for a timeout that ends within SleepMargin
// and reading the inbox once more; or deliver a timeout.
func (s *Store) resumeWait(ctx context.Context, id string, wt *Wait, now func() time.Time) (*Signal, error) {
	sg, err := s.firstSignalBefore(ctx, id, wt.Signals, 0)
	if err != nil || sg != nil {
		return sg, err
	}
	if wt.Until.IsZero() {
		return nil, nil
	}
	left := wt.Until.Sub(now())
	if near, err := WaitNearSleep(ctx, wt.Until, now); err != nil || !near {
		return nil, err
	}
	if left > 0 { // waited: a signal may have come meanwhile
		if sg, err := s.firstSignalBefore(ctx, id, wt.Signals, 0); err != nil || sg != nil {
			return sg, err
		}
	}
	return &Signal{TimedOut: true}, nil
}
