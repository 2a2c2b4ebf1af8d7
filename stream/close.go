package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrClosed is matched by the error of a write to a closed Writer and
// of a follow of a closed Hub: nothing of it was stored or read.
var ErrClosed = errors.New("stream: closed")

// crew counts the goroutines of a Writer or a Hub, so that its Close
// waits for them to end. The zero value is ready.
type crew struct {
	mu     sync.Mutex
	closed bool
	n      int
	zero   chan struct{} // closed (and dropped) when n falls to 0
}

// isClosed says whether close was called.
func (c *crew) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// close marks the crew closed, and says whether this call did.
func (c *crew) close() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := !c.closed
	c.closed = true
	return first
}

// goes runs f in a goroutine that wait waits for. It is counted even
// after close: a sender started by an emit that passed before Close
// still ends before Close returns.
func (c *crew) goes(f func()) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	c.run(f)
}

// goesIfOpen runs f as goes does, unless close was called.
func (c *crew) goesIfOpen(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.n++
	c.run(f)
}

func (c *crew) run(f func()) {
	go func() {
		defer c.done()
		f()
	}()
}

func (c *crew) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n--; c.n == 0 && c.zero != nil {
		close(c.zero)
		c.zero = nil
	}
}

// running counts the crew's goroutines.
func (c *crew) running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// wait returns once none of the crew's goroutines runs, or with an
// error wrapping ctx's when ctx ends first.
func (c *crew) wait(ctx context.Context, what string) error {
	c.mu.Lock()
	if c.n == 0 {
		c.mu.Unlock()
		return nil
	}
	if c.zero == nil {
		c.zero = make(chan struct{})
	}
	ch := c.zero
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stream: close the %s: %d goroutines still run: %w", what, c.running(), context.Cause(ctx))
	}
}

// Close ends the Writer: later writes (Append, Emit, ends) are refused
// with an error matching ErrClosed, a sweep of expired streams under way
// is stopped, and Close waits until the events emitted before it are
// sent and every goroutine of the Writer has ended, or until ctx ends
// (an error then; Close may be called again to wait again). It takes
// the Writer out of For's registry: For makes a new one. Every call
// after the first only waits.
func (w *Writer) Close(ctx context.Context) error {
	if w.crew.close() {
		w.stop()
		unregister(writers, registryKey{w.cli, w.keys.Root()}, w)
	}
	return w.crew.wait(ctx, "stream writer")
}

// closedErr is the error of a write to a closed Writer, nil while open.
func (w *Writer) closedErr(task string) error {
	if !w.crew.isClosed() {
		return nil
	}
	return fmt.Errorf("%w: the stream writer of namespace %s is closed: task %s's stream is not written", ErrClosed, w.keys.Root(), task)
}

// Close ends the Hub: every follow open ends with an error matching
// ErrClosed, later ones are refused so, and Close waits until every
// watch of the Hub has ended, or until ctx ends (an error then; Close
// may be called again to wait again). It takes the Hub out of HubFor's
// registry: HubFor makes a new one. Every call after the first only
// waits.
func (h *Hub) Close(ctx context.Context) error {
	h.mu.Lock()
	first := h.crew.close()
	h.mu.Unlock()
	if first {
		h.stop() // every watch's context: each ends, and closes its followers' feeds
		unregister(hubs, registryKey{h.cli, h.keys.Root()}, h)
	}
	return h.crew.wait(ctx, "stream hub")
}

// unregister takes v out of registry m, if it is there.
func unregister[V comparable](m map[registryKey]V, k registryKey, v V) {
	regMu.Lock()
	defer regMu.Unlock()
	if m[k] == v {
		delete(m, k)
	}
}

// CloseAll closes every Writer (For) and Hub (HubFor) of cli, of every
// namespace, as their Close does, bounded by ctx. A process calls it at
// its shutdown, before it closes cli: the events emitted are sent, and
// the follows open end with ErrClosed rather than the client's error.
func CloseAll(ctx context.Context, cli *clientv3.Client) error {
	var ws []*Writer
	var hs []*Hub
	regMu.Lock()
	for k, w := range writers {
		if k.cli == cli {
			ws = append(ws, w)
		}
	}
	for k, h := range hubs {
		if k.cli == cli {
			hs = append(hs, h)
		}
	}
	regMu.Unlock()
	var errs []error
	for _, h := range hs { // first: a follow ends at once, a writer may wait for its sends
		errs = append(errs, h.Close(ctx))
	}
	for _, w := range ws {
		errs = append(errs, w.Close(ctx))
	}
	return errors.Join(errs...)
}
