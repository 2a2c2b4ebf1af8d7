package stream

import (
	"context"
	"sync"
)

// outboxEvents and outboxBytes bound an attempt's events queued and not
// yet sent: an Emit past them waits for the writes before.
const (
	outboxEvents = 1000
	outboxBytes  = 512 << 10
)

// outbox is an attempt's events emitted and not yet sent. A goroutine
// sends them while there are any, all that came since its last write in
// its next, and ends when none is left: a stream emitting faster than a
// write takes has several events in each chunk. The zero value is ready.
type outbox struct {
	mu      sync.Mutex
	queued  []Input
	bytes   int
	sending bool
	err     error         // the first error of a write: every later Emit and Flush gets it
	changed chan struct{} // closed (and replaced) when a write ends
}

// put queues ins, waiting while the outbox is full, and starts the
// sender if none runs.
func (o *outbox) put(ctx context.Context, ins []Input, send func([]Input) error) error {
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
	if o.err != nil {
		return o.err
	}
	o.queued = append(o.queued, ins...)
	o.bytes += n
	if !o.sending {
		o.sending = true
		go o.run(send)
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
func (o *outbox) run(send func([]Input) error) {
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
		err := send(batch)
		o.mu.Lock()
		if err != nil && o.err == nil {
			o.err = err
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

// flush waits until nothing is queued or being sent, and returns the
// first error of a write.
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
	return o.err
}
