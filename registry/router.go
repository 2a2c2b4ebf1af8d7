package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
)

// ErrNoEndpoints is returned by Pick when no endpoint is live.
var ErrNoEndpoints = errors.New("registry: no live endpoint")

// Policy is how a Router picks among live endpoints.
type Policy interface {
	// pick returns the index into live (sorted by component, then id) of
	// the endpoint to use; live is never empty.
	pick(live []entry, turn uint64) int
}

type entry struct {
	Instance
	load float64
}

type roundRobin struct{}

func (roundRobin) pick(live []entry, turn uint64) int { return int(turn % uint64(len(live))) }

type random struct{}

func (random) pick(live []entry, _ uint64) int { return rand.IntN(len(live)) }

type leastLoad struct{ field string }

// pick returns the least loaded endpoint; among equals it takes turns, so
// equal endpoints share the traffic.
func (leastLoad) pick(live []entry, turn uint64) int {
	low := live[0].load
	for _, e := range live[1:] {
		low = min(low, e.load)
	}
	var tied []int
	for i, e := range live {
		if e.load == low {
			tied = append(tied, i)
		}
	}
	return tied[turn%uint64(len(tied))]
}

// RoundRobin picks the live endpoints in turn.
func RoundRobin() Policy { return roundRobin{} }

// Random picks a live endpoint uniformly at random.
func Random() Policy { return random{} }

// LeastLoad picks the live endpoint whose data has the smallest number in
// field (for example "request_active_slots" or "kv_active_blocks"). An
// endpoint without a number there counts as load 0: it has reported none
// yet. Equal loads take turns.
func LeastLoad(field string) Policy { return leastLoad{field: field} }

// Router keeps the live endpoints of a Watcher and picks one per request. It
// reads the Watcher's events itself; Close stops it (and not the Watcher).
type Router struct {
	w      *Watcher
	policy Policy

	mu      sync.RWMutex
	live    map[string]entry
	sorted  []entry // nil when live changed since it was built
	applied int64   // revision of the last event applied
	turn    uint64
	changed chan struct{} // closed and replaced at each applied event

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// NewRouter returns a Router over w's snapshot that follows w's events.
// Only one Router (or other reader) may consume a Watcher's events.
func NewRouter(w *Watcher, p Policy) *Router {
	r := &Router{w: w, policy: p, live: make(map[string]entry), changed: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	snap, rev := w.Snapshot()
	for _, in := range snap {
		r.live[in.Component+"/"+in.ID] = r.entry(in)
	}
	r.applied = rev
	go r.run()
	return r
}

func (r *Router) entry(in Instance) entry {
	e := entry{Instance: in}
	if ll, ok := r.policy.(leastLoad); ok && len(in.Data) > 0 {
		var data map[string]any
		if json.Unmarshal(in.Data, &data) == nil {
			if v, ok := data[ll.field].(float64); ok {
				e.load = v
			}
		}
	}
	return e
}

func (r *Router) run() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case ev, ok := <-r.w.Events():
			if !ok {
				return
			}
			key := ev.Instance.Component + "/" + ev.Instance.ID
			r.mu.Lock()
			if ev.Type == Delete {
				delete(r.live, key)
			} else {
				r.live[key] = r.entry(ev.Instance)
			}
			r.sorted = nil
			if ev.last {
				r.applied = ev.Revision
			}
			close(r.changed)
			r.changed = make(chan struct{})
			r.mu.Unlock()
		}
	}
}

// Pick returns a live endpoint chosen by the router's policy, or
// ErrNoEndpoints. An endpoint whose Delete the router has applied is never
// returned.
func (r *Router) Pick() (Instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.live) == 0 {
		return Instance{}, ErrNoEndpoints
	}
	if r.sorted == nil {
		r.sorted = make([]entry, 0, len(r.live))
		for _, e := range r.live {
			r.sorted = append(r.sorted, e)
		}
		sort.Slice(r.sorted, func(i, j int) bool {
			a, b := r.sorted[i], r.sorted[j]
			if a.Component != b.Component {
				return a.Component < b.Component
			}
			return a.ID < b.ID
		})
	}
	i := r.policy.pick(r.sorted, r.turn)
	r.turn++
	return r.sorted[i].Instance, nil
}

// Endpoints returns the live endpoints, sorted by component and id.
func (r *Router) Endpoints() []Instance {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Instance, 0, len(r.live))
	for _, e := range r.live {
		out = append(out, e.Instance)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Component != out[j].Component {
			return out[i].Component < out[j].Component
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Revision returns the revision of the last change the router applied.
func (r *Router) Revision() int64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.applied
}

// WaitRevision waits until the router has applied every change up to rev:
// every endpoint of a transaction at rev, not only the first. rev must be
// the revision of a change the router sees (a registration's write or
// removal, an Event's Revision); the router learns of no other revisions,
// so waiting for one past its last change waits for the next change.
func (r *Router) WaitRevision(ctx context.Context, rev int64) error {
	for {
		r.mu.RLock()
		applied, changed := r.applied, r.changed
		r.mu.RUnlock()
		if applied >= rev {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-r.done:
			return errors.New("registry: router closed")
		}
	}
}

// Close stops the router, waiting for its goroutine no longer than ctx
// allows. The Watcher stays open; close it separately. It is safe to call
// more than once.
func (r *Router) Close(ctx context.Context) error {
	r.stopOnce.Do(func() { close(r.stop) })
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("registry: close router: %w", ctx.Err())
	}
}
