package queue

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// promoteEvery is how often the external claims of one Client move a
// queue's due retries back to pending, at most (besides when a retry they
// know of falls due): a claim reads the retry schedule only then, so a
// retry another process scheduled may wait this much longer.
const promoteEvery = 250 * time.Millisecond

// broker is the state that the claims and reports of a Client's external
// workers share: the turn that spreads the claims over a queue's open
// segments, what each session's claims carry from one to the next, per
// queue when its due retries were last moved back to pending and when
// the next falls due; the combining of concurrent claims and reports; the
// line of claims that wait for work; and the memory of the runs claimed.
// The zero value is ready; a Client holds one.
type broker struct {
	turns atomic.Uint64
	// attempts counts the claims external claims made (tries of the
	// store, not calls of Claim).
	attempts atomic.Int64
	mu       sync.Mutex
	due      map[string]dueState
	hot      map[hotKey]sessionClaims
	// levels keeps each queue's anti-starvation turns (levelTurns) from
	// one external claim to the next: each claim has a claimer of its own.
	levels map[string]levelTurns
	// windows keeps each queue's bound on the read of its open segments
	// (openWindow) from one external claim to the next: without it every
	// claim read the open segments unbounded, and etcd counts every key of
	// that range, deleted ones too until compaction.
	windows map[string]openWindow

	// reports combines concurrent reports of outcomes (reportcombine.go).
	reports reportCombiner
	// claims remembers the runs of external claims (claimcache.go).
	claims claimCache
	// claimers combines concurrent external claims (claimcombine.go).
	claimers claimCombiner
	// waits lines up external claims that wait for work (claimwait.go).
	waits claimWaits
}

// levelTurnsOf returns the turns the last external claim of queue q left.
func (c *Client) levelTurnsOf(q string) levelTurns { return loadFor(&c.remote.mu, &c.remote.levels, q) }

// setLevelTurns keeps the turns an external claim of queue q leaves.
func (c *Client) setLevelTurns(q string, lt levelTurns) { storeFor(&c.remote.mu, &c.remote.levels, q, lt) }

// windowOf returns the open window the last external claim of queue q
// left.
func (c *Client) windowOf(q string) openWindow { return loadFor(&c.remote.mu, &c.remote.windows, q) }

// setWindow keeps the open window an external claim of queue q leaves.
func (c *Client) setWindow(q string, ow openWindow) { storeFor(&c.remote.mu, &c.remote.windows, q, ow) }

// loadFor returns queue q's value in *m, read under mu.
func loadFor[T any](mu *sync.Mutex, m *map[string]T, q string) T {
	mu.Lock()
	defer mu.Unlock()
	return (*m)[q]
}

// storeFor sets queue q's value in *m under mu; the map starts over past
// 4,096 queues, so that it stays bounded.
func storeFor[T any](mu *sync.Mutex, m *map[string]T, q string, v T) {
	mu.Lock()
	defer mu.Unlock()
	if *m == nil || len(*m) >= 4096 {
		*m = map[string]T{}
	}
	(*m)[q] = v
}

// hotKey names the claims of one session (lease) from one queue.
type hotKey struct {
	q     string
	lease int64
}

// sessionClaims is what one session's claims of a queue carry from one to
// the next, as a Worker's claim loop keeps it: the segment the last took
// from, if it had slots left (the next claim reads it with its first
// read); that segment's state as the claim left it, when known (the next
// claim takes from it without reading first, claimPredicted); and how many
// claims the session made (one in readEvery reads first all the same).
type sessionClaims struct {
	hot    string
	st     *segState
	claims int64
}

// sessionOf returns what the last claim of lease from queue q left.
func (c *Client) sessionOf(q string, lease int64) sessionClaims {
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	return c.remote.hot[hotKey{q, lease}]
}

// setSession keeps what a claim of lease from queue q leaves; a session
// with no segment with slots left keeps only its count of claims.
func (c *Client) setSession(q string, lease int64, sc sessionClaims) {
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	if sc.hot == "" || sc.st == nil || sc.st.name != sc.hot {
		sc.st = nil
	}
	if c.remote.hot == nil || len(c.remote.hot) >= 4096 {
		c.remote.hot = map[hotKey]sessionClaims{}
	}
	c.remote.hot[hotKey{q, lease}] = sc
}

// dueState is when a queue's due retries were last moved, and when its next
// retry falls due (zero: none was scheduled).
type dueState struct{ checked, next time.Time }

// promoteDue moves queue q's due retries back to pending, unless that was
// done less than promoteEvery ago and no retry known fell due since; it
// returns when the next falls due (zero: none known).
func (c *Client) promoteDue(ctx context.Context, w *claimer, q string) (time.Time, error) {
	now := time.Now()
	c.remote.mu.Lock()
	d, ok := c.remote.due[q]
	c.remote.mu.Unlock()
	if ok && now.Sub(d.checked) < promoteEvery && (d.next.IsZero() || now.Before(d.next)) {
		return d.next, nil
	}
	next, err := w.promoteDue(ctx, w.keys.QueueRetry(q))
	if err != nil {
		return time.Time{}, err
	}
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	if c.remote.due == nil || len(c.remote.due) >= 1024 {
		c.remote.due = map[string]dueState{}
	}
	c.remote.due[q] = dueState{checked: now, next: next}
	return next, nil
}

// retryAt notes that a retry of queue q falls due at at, so that a claim
// moves it back to pending then.
func (c *Client) retryAt(q string, at time.Time) {
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	if d, ok := c.remote.due[q]; ok && (d.next.IsZero() || at.Before(d.next)) {
		d.next = at
		c.remote.due[q] = d
	}
}
