package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Instance is one registered endpoint as etcd holds it.
type Instance struct {
	Component string `json:"component"`
	Endpoint
	// Lease is the lease the endpoint is bound to.
	Lease int64 `json:"lease"`
	// CreateRevision is when it was registered; ModRevision when it was
	// last written.
	CreateRevision int64 `json:"create_revision"`
	ModRevision    int64 `json:"mod_revision"`
}

// EventType says whether an endpoint was written or removed.
type EventType int

// Event types.
const (
	Put EventType = iota + 1
	Delete
)

// String returns "put" or "delete".
func (t EventType) String() string {
	switch t {
	case Put:
		return "put"
	case Delete:
		return "delete"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change to the watched endpoints.
type Event struct {
	Type EventType
	// Instance is the endpoint as written (Put) or as last seen (Delete).
	Instance Instance
	// Revision is the etcd revision of the change. After a re-list (see
	// Watch), a Delete carries the revision of the re-list.
	Revision int64

	// last marks the last event of its revision: one transaction (a lease
	// revoked, say) deletes many endpoints at one revision.
	last bool
}

// List returns the endpoints of component ("" for every component) and the
// revision they were read at.
func List(ctx context.Context, cli *clientv3.Client, ns string, component string) ([]Instance, int64, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, 0, err
	}
	prefix, err := prefixOf(keys, component)
	if err != nil {
		return nil, 0, err
	}
	g, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("registry: list %s: %w", prefix, err)
	}
	var out []Instance
	for _, kv := range g.Kvs {
		if in, ok := decode(keys, kv); ok {
			out = append(out, in)
		}
	}
	return out, g.Header.Revision, nil
}

func prefixOf(keys keyspace.Space, component string) (string, error) {
	if component == "" {
		return keys.Components(), nil
	}
	if err := CheckComponent("component", component); err != nil {
		return "", err
	}
	return keys.ComponentEndpoints(component), nil
}

// decode turns an endpoint key into an Instance; keys that are not endpoint
// keys are skipped. A value that is not an endpoint's JSON keeps only the id
// from its key.
func decode(keys keyspace.Space, kv *mvccpb.KeyValue) (Instance, bool) {
	component, id, ok := keys.EndpointOf(string(kv.Key))
	if !ok {
		return Instance{}, false
	}
	in := Instance{Component: component, Lease: kv.Lease, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision}
	if err := json.Unmarshal(kv.Value, &in.Endpoint); err != nil {
		in.Endpoint = Endpoint{}
	}
	in.ID = id
	return in, true
}

// Watcher follows the endpoints of one component, or of all. Create it with
// Watch; it is safe for concurrent use.
type Watcher struct {
	cli    *clientv3.Client
	keys   keyspace.Space
	prefix string
	logger *slog.Logger

	snapshot []Instance
	rev      int64 // revision of the snapshot

	events chan Event
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	relist int // how many times the watcher re-listed

	hook func() // test hook: runs between the snapshot and the first watch
}

// WatchOption changes a Watcher.
type WatchOption func(*Watcher)

// WithWatchLogger sets where a Watcher logs re-lists. Default slog.Default().
func WithWatchLogger(l *slog.Logger) WatchOption { return func(w *Watcher) { w.logger = l } }

// withStartHook runs f between the snapshot and the first watch (tests: to
// compact the snapshot's revision away).
func withStartHook(f func()) WatchOption { return func(w *Watcher) { w.hook = f } }

// Watch reads the current endpoints of component ("" for every component)
// and starts following them. Snapshot returns what was read; Events then
// delivers every Put and Delete from the snapshot's revision + 1 on, in
// revision order, with no gap and no duplicate.
//
// When the watch breaks in a way etcd cannot resume (the watcher fell behind
// a compaction, the watch was cancelled), the Watcher reads the endpoints
// again and emits the differences from what it had delivered: a Put for each
// endpoint that is new or changed, a Delete for each that is gone. An etcd
// restart is resumed by the client at the next revision. After a re-read,
// changes made in between are merged (an endpoint updated twice is one Put)
// and a Delete carries the re-read's revision. Events must be read promptly:
// the Watcher does not buffer without bound, it waits for the reader. ctx
// bounds only the first read; Close ends the Watcher.
func Watch(ctx context.Context, cli *clientv3.Client, ns string, component string, opts ...WatchOption) (*Watcher, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	prefix, err := prefixOf(keys, component)
	if err != nil {
		return nil, err
	}
	w := &Watcher{cli: cli, keys: keys, prefix: prefix, logger: slog.Default(), events: make(chan Event, 64), done: make(chan struct{})}
	for _, opt := range opts {
		opt(w)
	}
	w.snapshot, w.rev, err = List(ctx, cli, ns, component)
	if err != nil {
		return nil, err
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	go w.run()
	return w, nil
}

// Snapshot returns the endpoints read when the watcher was created, and the
// revision they were read at. Events starts right after that revision.
func (w *Watcher) Snapshot() ([]Instance, int64) { return w.snapshot, w.rev }

// Events delivers the changes after the snapshot. It is closed when the
// Watcher is closed.
func (w *Watcher) Events() <-chan Event { return w.events }

// Relists returns how many times the watcher had to read the endpoints again
// because its watch could not be resumed.
func (w *Watcher) Relists() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.relist
}

// Close stops the watcher and frees its watch; Events is closed once Close
// returns. It waits for the watcher's goroutine no longer than ctx allows.
// It is safe to call more than once.
func (w *Watcher) Close(ctx context.Context) error {
	w.cancel()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("registry: close watcher: %w", ctx.Err())
	}
}

// run is the watcher's one goroutine.
func (w *Watcher) run() {
	defer close(w.done)
	defer close(w.events)
	state := make(map[string]Instance, len(w.snapshot))
	for _, in := range w.snapshot {
		state[w.keys.Endpoint(in.Component, in.ID)] = in
	}
	rev := w.rev
	if w.hook != nil {
		w.hook()
	}
	backoff := 50 * time.Millisecond
	for w.ctx.Err() == nil {
		started := time.Now()
		var ok bool
		rev, ok = w.follow(state, rev)
		if ok || w.ctx.Err() != nil {
			continue
		}
		// A watch that breaks again at once must not spin: wait a little
		// longer each time, up to 2 s.
		if time.Since(started) > 10*time.Second {
			backoff = 50 * time.Millisecond
		}
		select {
		case <-w.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
		rev = w.relistUntilDone(state, rev)
	}
}

// follow delivers watch events after rev until the watch ends; it returns
// the last revision delivered, and false when the endpoints must be read
// again.
func (w *Watcher) follow(state map[string]Instance, rev int64) (int64, bool) {
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	from := rev
	wch := w.cli.Watch(ctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for resp := range wch {
		if resp.CompactRevision != 0 {
			w.logger.Warn("registry watch fell behind a compaction: reading the endpoints again", "prefix", w.prefix, "compacted", resp.CompactRevision, "at", rev)
			return rev, false
		}
		if err := resp.Err(); err != nil {
			if w.ctx.Err() == nil {
				w.logger.Warn("registry watch ended: reading the endpoints again", "prefix", w.prefix, "err", err)
			}
			return rev, false
		}
		// etcd never splits one revision across watch responses.
		batch := make([]Event, 0, len(resp.Events))
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision <= from {
				continue // already delivered
			}
			key := string(ev.Kv.Key)
			switch ev.Type {
			case mvccpb.PUT:
				in, ok := decode(w.keys, ev.Kv)
				if !ok {
					continue
				}
				state[key] = in
				batch = append(batch, Event{Type: Put, Instance: in, Revision: ev.Kv.ModRevision})
			case mvccpb.DELETE:
				in, ok := state[key]
				if !ok {
					continue
				}
				delete(state, key)
				batch = append(batch, Event{Type: Delete, Instance: in, Revision: ev.Kv.ModRevision})
			}
		}
		markLast(batch)
		for _, e := range batch {
			if !w.send(e) {
				return rev, true
			}
			rev = e.Revision
		}
	}
	return rev, w.ctx.Err() != nil
}

// relistUntilDone reads the endpoints again, retrying while etcd cannot be
// reached, and emits the differences from state.
func (w *Watcher) relistUntilDone(state map[string]Instance, rev int64) int64 {
	backoff := 100 * time.Millisecond
	for {
		g, err := w.cli.Get(w.ctx, w.prefix, clientv3.WithPrefix())
		if err == nil {
			w.mu.Lock()
			w.relist++
			w.mu.Unlock()
			return w.diff(state, g)
		}
		if w.ctx.Err() != nil {
			return rev
		}
		if !errors.Is(err, rpctypes.ErrCompacted) {
			w.logger.Warn("registry: cannot read the endpoints yet", "prefix", w.prefix, "err", err, "retry_in", backoff)
		}
		select {
		case <-w.ctx.Done():
			return rev
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// diff emits what changed between state and a fresh read, updates state,
// and returns the read's revision.
func (w *Watcher) diff(state map[string]Instance, g *clientv3.GetResponse) int64 {
	fresh := make(map[string]Instance, len(g.Kvs))
	var events []Event
	for _, kv := range g.Kvs {
		in, ok := decode(w.keys, kv)
		if !ok {
			continue
		}
		key := string(kv.Key)
		fresh[key] = in
		if old, had := state[key]; !had || old.ModRevision != in.ModRevision {
			events = append(events, Event{Type: Put, Instance: in, Revision: in.ModRevision})
		}
	}
	for key, in := range state {
		if _, ok := fresh[key]; !ok {
			events = append(events, Event{Type: Delete, Instance: in, Revision: g.Header.Revision})
		}
	}
	sort.SliceStable(events, func(i, j int) bool {
		if events[i].Revision != events[j].Revision {
			return events[i].Revision < events[j].Revision
		}
		return events[i].Instance.Component+"/"+events[i].Instance.ID < events[j].Instance.Component+"/"+events[j].Instance.ID
	})
	clear(state)
	for k, v := range fresh {
		state[k] = v
	}
	markLast(events)
	for _, e := range events {
		if !w.send(e) {
			break
		}
	}
	return g.Header.Revision
}

// send delivers e unless the watcher is closed first.
func (w *Watcher) send(e Event) bool {
	select {
	case w.events <- e:
		return true
	case <-w.ctx.Done():
		return false
	}
}

// markLast marks the last event of each revision in events, which are in
// revision order.
func markLast(events []Event) {
	for i := range events {
		events[i].last = i == len(events)-1 || events[i+1].Revision != events[i].Revision
	}
}
