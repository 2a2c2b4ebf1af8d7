package stream

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Attempt is a running attempt's stream, as a worker holds it from Begin
// to End: the handler's Emit calls write through it.
type Attempt struct {
	w *Writer
	c Claim
	// a is the Writer's state of the attempt, made by its first write:
	// an attempt that writes nothing costs the Writer nothing.
	once sync.Once
	a    *attempt
	// mayExist: the stream may have events that this process did not
	// write (an attempt before, a step before a sleep, a child process).
	mayExist atomic.Bool
	wrote    atomic.Bool
	// ended: End was called; later emits are refused.
	ended atomic.Bool
	// end is the chunk that stored End's end, if it did (set by End,
	// read by DoneOp on its goroutine).
	end chunk
	// out is the events emitted and not yet sent.
	out outbox
}

type attemptKey struct{}

// Begin starts claim c's attempt at its task's stream: Emit under the
// context it returns writes there, through the process's Writer (For).
// mayExist says that the stream may already have events (a retry, a
// resumed step): End then closes the attempt even if it emitted
// nothing. Nothing is written before the first Emit or End.
func Begin(ctx context.Context, cli *clientv3.Client, keys keyspace.Space, c Claim, mayExist bool) (context.Context, *Attempt) {
	at := &Attempt{w: For(cli, keys), c: c}
	at.out.send, at.out.goes = at.send, at.w.crew.goes
	at.mayExist.Store(mayExist)
	return context.WithValue(ctx, attemptKey{}, at), at
}

// FromContext returns the attempt Begin attached to ctx, nil if none.
func FromContext(ctx context.Context) *Attempt {
	at, _ := ctx.Value(attemptKey{}).(*Attempt)
	return at
}

// Elsewhere says that the attempt's events may be written by another
// process (a child process run by an exec handler, through the HTTP
// API), so that End closes the attempt even if this process emitted
// nothing.
func Elsewhere(ctx context.Context) {
	if at := FromContext(ctx); at != nil {
		at.mayExist.Store(true)
	}
}

// Emit appends an event of type typ to the stream of the task whose
// handler or step runs under ctx. data is the event's value: a
// json.RawMessage as it is, anything else as json.Marshal encodes it. It
// returns once the event is queued: the attempt's events go to etcd in
// order, together, while the handler goes on, so a producer of tokens is
// never held to one event per write; Flush waits until they are stored.
// An error matching ErrFenced says the attempt lost its claim or was
// ended (End: nothing it emits is stored from then on); ErrStreamFull,
// that a cap was reached; ErrNoClaim, that ctx is not a handler's;
// ErrClosed, that the process's Writer is closed. An error of a write
// already queued is returned by the next Emit or Flush:
// drover.ErrStoreFull says that etcd's database is past the store-full
// guard's high-water mark and the events queued were dropped, and so
// are the events of the Emit that returns it (those emitted after it
// are tried again).
func Emit(ctx context.Context, typ string, data any) error {
	at := FromContext(ctx)
	if at == nil {
		return ErrNoClaim
	}
	raw, ok := data.(json.RawMessage)
	if !ok {
		b, err := json.Marshal(data)
		if err != nil {
			return fmt.Errorf("stream: encode the data of a %q event: %w", typ, err)
		}
		raw = b
	}
	return at.Emit(ctx, Input{Type: typ, Data: raw})
}

// Token emits a "token" event: text, a piece of a model's output, as
// {"text": text}.
func Token(ctx context.Context, text string) error {
	return Emit(ctx, "token", struct {
		Text string `json:"text"`
	}{text})
}

// Flush waits until every event emitted under ctx's attempt is stored,
// and returns the first error of their writes.
func Flush(ctx context.Context) error {
	at := FromContext(ctx)
	if at == nil {
		return ErrNoClaim
	}
	return at.Flush(ctx)
}

// Emit queues events ins of the attempt's stream, in order; see the
// package function Emit.
func (at *Attempt) Emit(ctx context.Context, ins ...Input) error {
	c := at.c
	if err := c.Fence.Err(); err != nil { // lost: the handler's context may be ending too
		return fmt.Errorf("%w: claim of task %s token %d: %w", ErrFenced, c.Task, c.Fence.Token(), err)
	}
	if at.ended.Load() { // a handler left running past its attempt's end (a timeout)
		return fmt.Errorf("%w: claim of task %s token %d: attempt %d ended: it emits no more", ErrFenced, c.Task, c.Fence.Token(), c.Attempt)
	}
	if err := at.w.closedErr(c.Task); err != nil {
		return err
	}
	if err := checkInputs(ins, at.w.lim.MaxEventBytes, "emit"); err != nil {
		return err
	}
	now := at.w.now().UTC()
	for i := range ins {
		ins[i].at = now
	}
	at.wrote.Store(true)
	return at.out.put(ctx, ins)
}

// send writes a batch of the attempt's queued events. It waits under
// the client's context alone: the batch that takes them is bounded by
// the sender's timeout (Writer.send), and a context with a deadline of
// its own a write (a timer, and a child of the client's context under
// its lock) cost a thousand streams' writes 3 % of the process's CPU.
func (at *Attempt) send(ins []Input) error {
	_, _, err := at.w.appendChecked(at.w.cli.Ctx(), at.state(), ins) // checked by Emit; the outbox bounds their bytes
	return err
}

// Flush waits until the attempt's queued events are stored, and returns
// the first error of their writes.
func (at *Attempt) Flush(ctx context.Context) error { return at.out.flush(ctx) }

// Touched says whether the attempt's stream may have events: the
// attempt emitted, or its stream may have some from elsewhere. Only
// then does its task's end need a Done (Writer.Finish).
func (at *Attempt) Touched() bool { return at.wrote.Load() || at.mayExist.Load() }

// End closes the attempt's events with typ (AttemptEnded or Done),
// outcome and cause, while its claim still holds: if the attempt wrote
// events, or the stream may have some, it is written and End returns
// once it is stored; otherwise nothing is written. Every Emit of the
// attempt from End on is refused (ErrFenced).
func (at *Attempt) End(ctx context.Context, typ, outcome string, cause error) error {
	at.ended.Store(true)
	if !at.wrote.Load() && !at.mayExist.Load() {
		return nil
	}
	defer at.w.drop(at.c)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = at.Flush(fctx) // an attempt fenced or full still closes, if it can
	var err error
	at.end, err = at.w.end(ctx, at.state(), typ, outcome, cause, !at.wrote.Load())
	return err
}

// state returns the Writer's state of the attempt, made at the first call.
func (at *Attempt) state() *attempt {
	at.once.Do(func() { at.a = at.w.attempt(at.c) })
	return at.a
}

// End closes claim c's attempt with typ (AttemptEnded or Done), outcome
// and cause, if its task's stream has events (an external worker's
// attempt, ended through the API); see Attempt.End.
func (w *Writer) End(ctx context.Context, c Claim, typ, outcome string, cause error) error {
	_, err := w.end(ctx, w.attempt(c), typ, outcome, cause, true)
	return err
}

// Ended closes the attempt of task's claim token, which already ended
// through its claim (an external worker's ack or fail), with typ,
// outcome and cause (""), if that claim wrote the stream's last events
// and they do not end already, whichever process's writer stored them
// (the stream's last chunk is read); otherwise it does nothing. The
// claim is gone, so the write is fenced by the stream alone: it is
// stored only if no later attempt has written.
func (w *Writer) Ended(ctx context.Context, task string, token int64, typ, outcome, cause string) error {
	w.attMu.Lock()
	delete(w.attempts, attemptID{task, token}) // the attempt ended: its state here, if any, is done with
	w.attMu.Unlock()
	a := &attempt{c: Claim{Task: task}, claimEnd: true, endOf: token}
	return w.endRequest(ctx, a, typ, ownData{Outcome: outcome, Error: cause}, true, true)
}

// Finish closes task's stream with Done, outcome and cause (""): the
// task ended (succeeded, dead, cancelled), and the transition that
// ended it is stored. The Done goes after the stream's last event,
// whichever attempt wrote it, fenced by the stream alone, which is
// safe as the task will not run again. A stream without events, or one
// that already ends with Done, is left as it is.
func (w *Writer) Finish(ctx context.Context, task, outcome, cause string) error {
	a := &attempt{c: Claim{Task: task}, final: true}
	return w.endRequest(ctx, a, Done, ownData{Outcome: outcome, Error: cause}, true, true)
}

func (w *Writer) end(ctx context.Context, a *attempt, typ, outcome string, cause error, probe bool) (chunk, error) {
	d := ownData{Attempt: a.c.Attempt, Outcome: outcome}
	if cause != nil {
		d.Error = cause.Error()
	}
	return w.endStored(ctx, a, typ, d, probe, false)
}

// endRequest writes attempt a's end, and returns once it is stored.
func (w *Writer) endRequest(ctx context.Context, a *attempt, typ string, d ownData, probe, claimGone bool) error {
	_, err := w.endStored(ctx, a, typ, d, probe, claimGone)
	return err
}

// endStored is endRequest that also returns the chunk that stored the
// end (request.stored).
func (w *Writer) endStored(ctx context.Context, a *attempt, typ string, d ownData, probe, claimGone bool) (chunk, error) {
	if err := w.closedErr(a.c.Task); err != nil {
		return chunk{}, err
	}
	r := &request{a: a, end: &Input{Type: typ, Data: d.raw()}, probe: probe, claimGone: claimGone, at: w.now().UTC()}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endWriteTimeout)
	defer cancel()
	if err := w.send(ctx, r); err != nil {
		return chunk{}, err
	}
	return r.stored, r.err
}
