package stream

import (
	"context"
	"errors"
	"sync"
)

// outboxEvents and outboxBytes bound an attempt's events queued and not
// yet sent: an Emit past them waits for the writes before.
const (
	outboxEvents = 1000
	outboxBytes  = 512 << 10
)

// spareEvents bounds the room an idle outbox keeps for its next events:
// a burst's does not stay with every attempt.
const spareEvents = 64

// outbox is an attempt's events emitted and not yet sent. A goroutine
// sends them while there are any, all that came since its last write in
// its next, and ends when none is left: a stream emitting faster than a
// write takes has several events in each chunk. The zero value with send
// set is ready.
type outbox struct {
	send    func([]Input) error // writes a batch of its events (set once, before the first put)
	goes    func(func())        // starts the sender (set with send; nil: a goroutine of its own)
	mu      sync.Mutex
	queued  []Input
	spare   []Input // a batch sent, emptied: the next queue's room
	bytes   int
	sending bool
	err     error         // a write fenced or over a cap: every later Emit and Flush gets it
	failed  error         // a write that failed otherwise (etcd): the next Emit or Flush gets it, once
	changed chan struct{} // closed (and replaced) when a write ends
}

// put queues ins, waiting while the outbox is full, and starts the
// sender if none runs.
func (o *outbox) put(ctx context.Context, ins []Input) error {
	n := 0
	for _, in := range ins {
		n += in.size()
	}
	o.mu.Lock()
	for o.err == nil && len(o.queued) > 0 && (len(o.queued)+len(ins) > outboxEvents || o.bytes+n > outboxBytes) {
		ch := o.wait()
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		o.mu.Lock()
	}
	defer o.mu.Unlock()
	if err := o.takeErr(); err != nil {
		return err
	}
	if o.queued == nil {
		o.queued, o.spare = o.spare, nil
	}
	o.queued = append(o.queued, ins...)
	o.bytes += n
	if !o.sending {
		o.sending = true
		if o.goes != nil {
			o.goes(o.run)
		} else {
			go o.run()
		}
	}
	return nil
}

// wait returns a channel closed when a write ends. o.mu is held.
func (o *outbox) wait() <-chan struct{} {
	if o.changed == nil {
		o.changed = make(chan struct{})
	}
	return o.changed
}

// run sends the queued events until none is left or a write failed.
func (o *outbox) run() {
	for {
		o.mu.Lock()
		batch := o.queued
		if len(batch) == 0 || o.err != nil {
			o.queued, o.bytes, o.sending = nil, 0, false
			o.signal()
			o.mu.Unlock()
			return
		}
		o.queued, o.bytes = nil, 0
		o.mu.Unlock()
		err := o.send(batch)
		clear(batch) // nothing holds it once sent: its room takes the next events
		o.mu.Lock()
		if cap(batch) <= spareEvents {
			o.spare = batch[:0]
		}
		switch {
		case err == nil:
		case errors.Is(err, ErrFenced) || errors.Is(err, ErrStreamFull):
			if o.err == nil {
				o.err = err
			}
		case o.failed == nil:
			o.failed = err // its events may or may not be stored; the next ones are tried
		}
		o.signal()
		o.mu.Unlock()
	}
}

// signal wakes the waiters of o.changed. o.mu is held.
func (o *outbox) signal() {
	if o.changed != nil {
		close(o.changed)
		o.changed = nil
	}
}

// takeErr returns the error a caller is to get: the sticky one, else a
// failed write's, once. o.mu is held.
func (o *outbox) takeErr() error {
	if o.err != nil {
		return o.err
	}
	err := o.failed
	o.failed = nil
	return err
}

// flush waits until nothing is queued or being sent, and returns the
// error of a write: one fenced or over a cap, or, once, one that failed
// otherwise.
func (o *outbox) flush(ctx context.Context) error {
	o.mu.Lock()
	for o.sending {
		ch := o.wait()
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		o.mu.Lock()
	}
	defer o.mu.Unlock()
	return o.takeErr()
}
