package queue_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// getPoller reads task id of queue q in a tight loop until stopped, and
// counts the reads that did not find it there (an error, or a task of
// another queue) or found it asleep after the stats counted it awake.
type getPoller struct {
	reads, missed atomic.Int64
	mu            sync.Mutex
	first         string // the first miss, for the failure message
	statuses      map[queue.Status]int
	stop          chan struct{}
	done          chan struct{}
}

func startGetPoller(c *queue.Client, q, id string) *getPoller {
	p := &getPoller{statuses: map[queue.Status]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			t, err := c.Get(context.Background(), id)
			p.reads.Add(1)
			p.mu.Lock()
			switch {
			case err != nil:
				p.missed.Add(1)
				if p.first == "" {
					p.first = err.Error()
				}
			case t.Queue != q:
				p.missed.Add(1)
				if p.first == "" {
					p.first = fmt.Sprintf("task %s read in queue %q, status %s", t.ID, t.Queue, t.CurrentStatus)
				}
			case t.CurrentStatus == queue.Sleeping:
				p.statuses[t.CurrentStatus]++
				// Asleep as read: the stats count it, unless it fell
				// due since, and then a read after them finds it awake.
				st, err := c.Stats(context.Background(), q)
				if err == nil && st.Sleeping != 1 {
					if t2, err := c.Get(context.Background(), id); err == nil && t2.CurrentStatus == queue.Sleeping {
						p.missed.Add(1)
						if p.first == "" {
							p.first = fmt.Sprintf("task %s SLEEPING, then stats of %d sleeping, then SLEEPING again", id, st.Sleeping)
						}
					}
				}
			default:
				p.statuses[t.CurrentStatus]++
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *getPoller) halt() {
	close(p.stop)
	<-p.done
}

// TestGetFindsTaskThroughSleep: a task of a segment claimed over the
// external-claim API, reported asleep, moved back to pending when due,
// claimed again and acked is found by every Get along the way, in its
// own queue.
func TestGetFindsTaskThroughSleep(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	const rounds = 8
	var missed, reads int64
	var first string
	for r := 0; r < rounds; r++ {
		q, id := fmt.Sprintf("napq-%d", r), fmt.Sprintf("t%d", r)
		if res, err := c.Submit(ctx, q, []queue.Task{{ID: id, Type: "poll"}}, nil); err != nil || res.Submitted != 1 {
			t.Fatalf("submit: %+v %v", res, err)
		}
		p := startGetPoller(c, q, id)
		l := grantLease(t, cli, 10*time.Second)
		claimed, err := c.Claim(ctx, q, queue.ClaimRequest{Lease: l, Worker: "w1", Max: 1, Wait: 10 * time.Second})
		if err != nil || len(claimed) != 1 {
			p.halt()
			t.Fatalf("round %d: claimed %d, err %v", r, len(claimed), err)
		}
		rep, err := c.Report(ctx, []queue.Outcome{{Held: held(q, claimed[0], l), SleepUntil: time.Now().Add(50 * time.Millisecond)}})
		if err != nil || rep[0].Err != nil || rep[0].Task.CurrentStatus != queue.Sleeping {
			p.halt()
			t.Fatalf("round %d: sleep report: %+v %v", r, rep, err)
		}
		var again []*queue.Task
		for try := 0; try < 300 && err == nil && len(again) == 0; try++ {
			again, err = c.Claim(ctx, q, queue.ClaimRequest{Lease: l, Worker: "w1", Max: 1, Wait: 100 * time.Millisecond})
		}
		if err != nil || len(again) != 1 {
			p.halt()
			t.Fatalf("round %d: claimed again %d, err %v", r, len(again), err)
		}
		if _, err := c.Ack(ctx, held(q, again[0], l), []byte(`"done"`)); err != nil {
			p.halt()
			t.Fatalf("round %d: ack: %v", r, err)
		}
		tk, err := c.Get(ctx, id)
		p.halt()
		if err != nil || tk.CurrentStatus != queue.Succeeded || tk.Queue != q {
			t.Fatalf("round %d: after the ack: %+v %v", r, tk, err)
		}
		missed, reads = missed+p.missed.Load(), reads+p.reads.Load()
		if first == "" {
			first = p.first
		}
		t.Logf("round %d: %d reads, %d missed, statuses %v", r, p.reads.Load(), p.missed.Load(), p.statuses)
	}
	if missed > 0 {
		t.Fatalf("%d of %d reads did not find the task in its queue; the first: %s", missed, reads, first)
	}
}
