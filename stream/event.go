package stream

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/lease"
)

// Event is one event of a task's stream.
type Event struct {
	// Seq is the event's place in the stream: 1, 2, 3, ... with no gap.
	Seq int64 `json:"seq"`
	// Attempt is the task's attempt that wrote it.
	Attempt int `json:"attempt"`
	// Type says what the event is: the writer's own ("token", "progress",
	// "log"), or drover's: [AttemptStarted], [AttemptLost],
	// [AttemptEnded], [Done].
	Type string `json:"type"`
	// Data is the event's JSON value (null when it has none).
	Data json.RawMessage `json:"data"`
	// Time is when the writer emitted it.
	Time time.Time `json:"time"`
}

// drover's own event types.
const (
	// AttemptStarted opens each attempt's events: data {"attempt",
	// "worker", "token"}.
	AttemptStarted = "attempt_started"
	// AttemptLost says that the attempt before ended without saying so
	// (its worker died or lost its claim): data {"attempt", "token"}. The
	// next attempt writes it, before its AttemptStarted; nothing of the
	// lost attempt follows it.
	AttemptLost = "attempt_lost"
	// AttemptEnded closes an attempt that did not end the task (it will
	// be retried, it sleeps, it was handed back): data {"attempt",
	// "outcome", "error"}.
	AttemptEnded = "attempt_ended"
	// Done closes the stream: the task ended, data {"attempt", "outcome",
	// "error"} with outcome "succeeded", "dead" or "cancelled".
	Done = "done"
)

// Errors of writes.
var (
	// ErrFenced is matched by the error of an emit under a claim that no
	// longer holds (lease.ErrFenced): nothing of it was stored, and
	// nothing of the attempt will be.
	ErrFenced = lease.ErrFenced
	// ErrStreamFull is matched by the error of an emit that would take
	// the stream past one of its caps ([Limits]): nothing of it was
	// stored.
	ErrStreamFull = errors.New("stream: full")
	// ErrNoClaim is the error of Emit outside a handler or step of a
	// worker: there is no claim to write under.
	ErrNoClaim = errors.New("stream: no claim in the context: emit from a handler or step run by a worker")
	// ErrMoved is matched by the error of an AppendAfter whose stream's
	// last event was not the one it named: another write came first, and
	// nothing of it was stored.
	ErrMoved = errors.New("stream: the stream's last event is not the one named")
)

// Limits are the caps of every stream, and how long a stream is kept.
type Limits struct {
	// MaxEventBytes caps one event's type and data.
	MaxEventBytes int
	// MaxEvents caps a stream's events (drover's own do not count).
	MaxEvents int64
	// MaxBytes caps the bytes of a stream's events' types and data.
	MaxBytes int64
	// Retention is how long a stream is kept after its task ended.
	Retention time.Duration
	// MaxAge is how long a stream whose task never ends is kept after
	// its first event.
	MaxAge time.Duration
}

// DefaultLimits are the limits of a Writer made without others.
var DefaultLimits = Limits{
	MaxEventBytes: 64 << 10,
	MaxEvents:     100_000,
	MaxBytes:      16 << 20,
	Retention:     24 * time.Hour,
	MaxAge:        7 * 24 * time.Hour,
}

// Input is an event to emit: its type and its data, a JSON value.
type Input struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
	at   time.Time       // when it was emitted, if before its write
}

// maxTypeLen bounds an event's type.
const maxTypeLen = 64

// check validates in, the i-th of a write, against the event size cap.
func (in Input) check(i, maxBytes int) error {
	field := func() string { return fmt.Sprintf("events[%d]", i) }
	if in.Type == "" || len(in.Type) > maxTypeLen {
		return &drover.InputError{Field: field() + ".type", Value: in.Type, Rule: fmt.Sprintf("must be 1 to %d characters", maxTypeLen)}
	}
	switch in.Type {
	case AttemptStarted, AttemptLost, AttemptEnded, Done:
		return &drover.InputError{Field: field() + ".type", Value: in.Type, Rule: "must not be one of drover's own (attempt_started, attempt_lost, attempt_ended, done)"}
	}
	if len(in.Data) > 0 && !json.Valid(in.Data) {
		return &drover.InputError{Field: field() + ".data", Value: string(in.Data), Rule: "must be a JSON value"}
	}
	if n := in.size(); n > maxBytes {
		return fmt.Errorf("%w: %s is %d bytes, over the %d-byte limit of one event", ErrStreamFull, field(), n, maxBytes)
	}
	return nil
}

// size is what an event counts against the stream's byte cap.
func (in Input) size() int { return len(in.Type) + len(in.Data) }

// chunk is what a chunk key holds (storedChunk encodes it): the events
// one attempt flushed at once, and the stream's totals through them.
type chunk struct {
	// Attempt and Token name the attempt that wrote the chunk.
	Attempt int
	Token   int64
	// Events and Bytes count the stream's own events (not drover's)
	// through this chunk, and their bytes.
	Events int64
	Bytes  int64
	// List holds the chunk's events, in order.
	List []Event
}

// storedChunk is a chunk as its key holds it: its events without their
// attempt (the chunk's) and with their time in Unix nanoseconds, which
// encode and decode in a fraction of RFC 3339's time.
type storedChunk struct {
	Attempt int           `json:"attempt"`
	Token   int64         `json:"token"`
	Events  int64         `json:"events"`
	Bytes   int64         `json:"bytes"`
	List    []storedEvent `json:"list"`
}

type storedEvent struct {
	Seq  int64           `json:"s"`
	Type string          `json:"t"`
	Data json.RawMessage `json:"d"`
	At   int64           `json:"at"`
}

// encode returns c as its key holds it (appendChunk).
func (c chunk) encode() []byte {
	n := 96
	for _, ev := range c.List {
		n += 48 + len(ev.Type) + len(ev.Data)
	}
	return appendChunk(make([]byte, 0, n), c)
}

// decodeChunk reads the value v of chunk key key: decodeFast, or
// encoding/json for a value it does not follow. (key is read only for
// an error: a hub decodes every chunk it watches.)
func decodeChunk(key []byte, v []byte) (chunk, error) {
	if c, ok := decodeFast(v); ok {
		return c, nil
	}
	var sc storedChunk
	if err := json.Unmarshal(v, &sc); err != nil {
		return chunk{}, fmt.Errorf("stream: chunk %s is unreadable: %w", key, err)
	}
	c := chunk{Attempt: sc.Attempt, Token: sc.Token, Events: sc.Events, Bytes: sc.Bytes, List: make([]Event, len(sc.List))}
	for i, ev := range sc.List {
		c.List[i] = Event{Seq: ev.Seq, Attempt: sc.Attempt, Type: ev.Type, Data: ev.Data, Time: time.Unix(0, ev.At).UTC()}
	}
	return c, nil
}

// ends says whether an event of type typ ends its attempt.
func ends(typ string) bool { return typ == Done || typ == AttemptEnded }

// ownData is the data of drover's own events.
type ownData struct {
	Attempt int    `json:"attempt"`
	Worker  string `json:"worker,omitempty"`
	Token   int64  `json:"token,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	Error   string `json:"error,omitempty"`
}

func (d ownData) raw() json.RawMessage {
	b, _ := json.Marshal(d)
	return b
}
