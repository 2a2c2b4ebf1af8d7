package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A paused queue takes submissions and keeps its tasks, but no claim of
// its tasks commits: its pause key (keyspace.Space.QueuePaused) is a
// fence. Every claim transaction (claimKeys, runClaim.op) compares that
// the key does not exist, so no claim commits at a revision after the
// pause's, whatever a worker knows: a pause takes effect fleet-wide the
// moment Pause returns, at the cost of one compare in each claim and no
// round trip. A claim the fence refuses reads the key in its Else branch
// (no extra request either) and so learns the pause's revision; the
// claimer's Client remembers it (pauseKnown), and its claims wait on the
// queue's shared watch (watchhub.go) for the key's deletion instead of
// claiming, so a paused queue costs its idle workers nothing. Tasks
// already running finish and report as usual: outcomes, heartbeats and
// cancels are not fenced by the pause.

// PauseState is whether a queue is paused, and since when.
type PauseState struct {
	Queue  string `json:"queue"`
	Paused bool   `json:"paused"`
	// Since is when the queue was paused (zero when it is not).
	Since time.Time `json:"since,omitzero"`
	// Changed is false when the queue already was in the state asked
	// for (pausing a paused queue, resuming a running one).
	Changed bool `json:"changed"`
}

// pauseValue is the value of a queue's pause key.
type pauseValue struct {
	At time.Time `json:"at"`
}

// Pause pauses queue q: from the moment it returns no claim of its tasks
// commits, in any process, until Resume. Submissions are accepted and
// tasks already running finish and are acknowledged as usual. Pausing a
// paused queue changes nothing (Changed false). It returns ErrNoQueue
// when q was never submitted to or configured.
func (c *Client) Pause(ctx context.Context, q string) (PauseState, error) {
	if err := CheckQueue(q); err != nil {
		return PauseState{}, err
	}
	// The queue's existence is one of the transaction's compares, not a
	// read before it: a pause racing with DeleteQueue either lands first
	// (and the deletion removes it) or finds no queue; it never outlives
	// the queue.
	key, name := c.keys.QueuePaused(q), c.keys.QueueName(q)
	v, _ := json.Marshal(pauseValue{At: c.now().UTC()})
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(name), ">", 0), clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(v))).Else(clientv3.OpGet(key), clientv3.OpGet(name, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return PauseState{}, fmt.Errorf("queue: pause %s: %w", q, err)
	}
	st := PauseState{Queue: q, Paused: true, Changed: resp.Succeeded}
	if resp.Succeeded {
		c.pauses.saw(q, true, resp.Header.Revision)
		st.Since = decodePause(v)
		return st, nil
	}
	if resp.Responses[1].GetResponseRange().Count == 0 {
		return PauseState{}, noQueue(q)
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		c.pauses.saw(q, true, kvs[0].ModRevision)
		st.Since = decodePause(kvs[0].Value)
	}
	return st, nil
}

// Resume lets the workers claim queue q's tasks again; they learn of it
// from their watch of the queue within a round trip. Resuming a queue
// that is not paused changes nothing (Changed false). It returns
// ErrNoQueue when q was never submitted to or configured.
func (c *Client) Resume(ctx context.Context, q string) (PauseState, error) {
	if err := c.mustExist(ctx, q); err != nil {
		return PauseState{}, err
	}
	resp, err := c.cli.Delete(ctx, c.keys.QueuePaused(q))
	if err != nil {
		return PauseState{}, fmt.Errorf("queue: resume %s: %w", q, err)
	}
	c.pauses.saw(q, false, resp.Header.Revision)
	return PauseState{Queue: q, Changed: resp.Deleted > 0}, nil
}

// Paused reads whether queue q is paused, and since when.
func (c *Client) Paused(ctx context.Context, q string) (PauseState, error) {
	if err := CheckQueue(q); err != nil {
		return PauseState{}, err
	}
	resp, err := c.cli.Get(ctx, c.keys.QueuePaused(q))
	if err != nil {
		return PauseState{}, fmt.Errorf("queue: read the pause of %s: %w", q, err)
	}
	if len(resp.Kvs) == 0 {
		c.pauses.saw(q, false, resp.Header.Revision)
		return PauseState{Queue: q}, nil
	}
	c.pauses.saw(q, true, resp.Kvs[0].ModRevision)
	return PauseState{Queue: q, Paused: true, Since: decodePause(resp.Kvs[0].Value)}, nil
}

// mustExist returns ErrNoQueue when q (checked) is not a queue.
func (c *Client) mustExist(ctx context.Context, q string) error {
	ok, err := c.Exists(ctx, q)
	if err != nil {
		return err
	}
	if !ok {
		return noQueue(q)
	}
	return nil
}

func decodePause(v []byte) time.Time {
	var pv pauseValue
	_ = json.Unmarshal(v, &pv)
	return pv.At
}

// notPaused is the fence every claim of queue q compares: its pause key
// does not exist.
func (c *Client) notPaused(q string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(c.keys.QueuePaused(q)), "=", 0)
}

// ifPaused is the Else branch of a claim refused by the fence: it reads
// the pause key, whose revision the claim's Client remembers (refusedBy).
func (c *Client) ifPaused(q string) clientv3.Op { return clientv3.OpGet(c.keys.QueuePaused(q)) }

// refusedBy reports whether the answer to ifPaused found queue q paused,
// and then remembers it.
func (c *Client) refusedBy(q string, r *clientv3.GetResponse) bool {
	if r == nil || len(r.Kvs) == 0 {
		return false
	}
	c.pauses.saw(q, true, r.Kvs[0].ModRevision)
	return true
}

// pauseKnown is what a Client learned of its queues' pauses: for each, the
// latest revision at which it saw the pause key written or deleted. Only
// a wait that watches from that revision acts on it (awaitResume), so
// knowledge that went stale (a resume nobody here saw) is corrected by
// the first wait: the shared watch replays what came after, or the wait
// reads the key.
type pauseKnown struct {
	mu sync.Mutex
	m  map[string]pauseSeen
	// gauged are the queues whose drover_queue_paused gauge this Client
	// sets: a Worker's queue (Worker.Run). The gauge has no namespace
	// label, as drover_queue_tasks has none: in a process whose Clients
	// serve several namespaces (the server's), only the owner of the
	// depth gauges sets it (the server's stats hub, for its own
	// namespace), not every Client that claims.
	gauged map[string]bool
}

type pauseSeen struct {
	paused bool
	rev    int64
}

// gauge makes the Client set queue q's drover_queue_paused gauge from
// what it learns.
func (p *pauseKnown) gauge(q string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gauged == nil {
		p.gauged = map[string]bool{}
	}
	p.gauged[q] = true
	if s, ok := p.m[q]; ok {
		metrics.QueuePaused.WithLabelValues(q).Set(map[bool]float64{true: 1}[s.paused])
	}
}

// saw records that queue q was paused (or not) at revision rev, unless
// something later is known; it sets the drover_queue_paused gauge when
// the Client owns it (gauge).
func (p *pauseKnown) saw(q string, paused bool, rev int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.m[q]; ok && cur.rev > rev {
		return
	}
	if p.m == nil {
		p.m = map[string]pauseSeen{}
	}
	p.m[q] = pauseSeen{paused: paused, rev: rev}
	if p.gauged[q] {
		metrics.QueuePaused.WithLabelValues(q).Set(map[bool]float64{true: 1}[paused])
	}
}

// since is the revision at which queue q was last seen paused, 0 when it
// was not seen paused since it was last seen running.
func (p *pauseKnown) since(q string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.m[q]; s.paused {
		return s.rev
	}
	return 0
}

// sawEvent records a pause or resume of queue q among a watch's events; it
// reports whether the queue was resumed.
func (c *Client) sawEvent(q string, ev *clientv3.Event) (resumed bool) {
	if string(ev.Kv.Key) != c.keys.QueuePaused(q) {
		return false
	}
	c.pauses.saw(q, ev.Type == clientv3.EventTypePut, ev.Kv.ModRevision)
	return ev.Type == clientv3.EventTypeDelete
}

// endsRun reports whether ev, an event of queue q's watch, ends a claim:
// a claim key or a segment's run deleted (a task finished, was handed
// back, or its worker died).
func (c *Client) endsRun(q string, ev *clientv3.Event) bool {
	if ev.Type != clientv3.EventTypeDelete {
		return false
	}
	k := string(ev.Kv.Key)
	if strings.HasPrefix(k, c.keys.QueueClaims(q)) {
		return true
	}
	_, _, ok := keyspace.SegmentPart(c.keys.Runs(q, ""), k)
	return ok
}

// resumeWait is what else ends a wait for a resume (awaitResume) than the
// resume, its time, or its context.
type resumeWait struct {
	// stop ends it (a worker stopping).
	stop <-chan struct{}
	// ended ends it: a task of the waiting worker ended (a draining
	// worker checks whether it is done).
	ended <-chan struct{}
	// anyEnd ends it at any claim of the queue ending, in any process (a
	// draining worker with nothing running waits for the others' tasks).
	anyEnd bool
}

// awaitResume blocks while queue q, seen paused at revision rev, stays
// paused: until its pause key is deleted (true), for at most d, or until
// ctx ends or something of o happens (false). It waits on the queue's
// shared watch, from rev, so a resume since is not missed; when the watch
// may have missed events it reads the key. at is the revision up to which
// it saw the queue's events: a wait that follows this one, from at, sees
// only what came after.
func (c *Client) awaitResume(ctx context.Context, q string, rev int64, d time.Duration, o resumeWait) (resumed bool, at int64) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		wt := c.waitAfter(q, rev)
		missed := false
		for !missed {
			select {
			case <-wt.C():
				var evs []*clientv3.Event
				evs, missed = wt.Take()
				woke := false
				for _, ev := range evs {
					rev = max(rev, ev.Kv.ModRevision)
					if c.sawEvent(q, ev) {
						wt.Stop()
						return true, rev
					}
					woke = woke || o.anyEnd && c.endsRun(q, ev)
				}
				if woke {
					wt.Stop()
					return false, rev
				}
			case <-t.C:
				wt.Stop()
				return false, rev
			case <-ctx.Done():
				wt.Stop()
				return false, rev
			case <-o.stop:
				wt.Stop()
				return false, rev
			case <-o.ended:
				wt.Stop()
				return false, rev
			}
		}
		wt.Stop()
		resp, err := c.cli.Get(ctx, c.keys.QueuePaused(q))
		switch {
		case err != nil:
			select { // the store is out of reach: try again a moment later
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
			case <-o.stop:
			}
		case len(resp.Kvs) == 0:
			c.pauses.saw(q, false, resp.Header.Revision)
			return true, resp.Header.Revision
		default:
			c.pauses.saw(q, true, resp.Kvs[0].ModRevision)
			rev = resp.Header.Revision // the watch goes on from the read
			if o.anyEnd {
				return false, rev // what it missed may have been a task's end
			}
		}
	}
}
