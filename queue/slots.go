package queue

import (
	"sync"
	"time"
)

// slotPool counts a worker's task slots: the tasks it holds claimed,
// running or waiting to run. A claimer reserves slots before it claims, so
// that claimers running at once never claim more tasks than there are
// slots, and gives back those its claim did not fill. held slots are not
// to be reserved for now (see Worker.aheadHeld).
type slotPool struct {
	mu    sync.Mutex
	free  int
	size  int
	held  int
	freed chan struct{} // closed, and replaced, whenever slots come free
	ended chan struct{} // closed, and replaced, whenever a task ends
}

func newSlotPool(n, held int) *slotPool {
	return &slotPool{free: n, size: n, held: held, freed: make(chan struct{}), ended: make(chan struct{})}
}

// hold keeps n slots from being reserved (0: all may be).
func (p *slotPool) hold(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n < p.held {
		close(p.freed)
		p.freed = make(chan struct{})
	}
	p.held = n
}

// reserve takes up to n free slots; with none free it returns 0 and a
// channel closed once some come free.
func (p *slotPool) reserve(n int) (int, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := max(0, min(n, p.free-p.held))
	p.free -= k
	return k, p.freed
}

// release gives back n reserved slots that a claim did not fill, and wakes
// claimers waiting for a slot.
func (p *slotPool) release(n int) {
	if n == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free += n
	close(p.freed)
	p.freed = make(chan struct{})
}

// end gives back the slot of a task that ended, and wakes claimers waiting
// for a slot or for a task to end.
func (p *slotPool) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free++
	close(p.freed)
	p.freed = make(chan struct{})
	close(p.ended)
	p.ended = make(chan struct{})
}

// state returns how many slots are in use (running or reserved) and a
// channel closed once a task ends.
func (p *slotPool) state() (int, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.size - p.free, p.ended
}

// gather waits, for at most d, until want slots are free or no task is
// running (a claim of a few slots costs the round trips of a claim of many),
// or until stop is closed.
func (p *slotPool) gather(want int, d time.Duration, stop <-chan struct{}) {
	var timer *time.Timer
	for {
		p.mu.Lock()
		free, busy, freed := max(0, p.free-p.held), p.size-p.free, p.freed
		p.mu.Unlock()
		if free >= want || busy == 0 || free == 0 {
			return
		}
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		}
		select {
		case <-freed:
		case <-timer.C:
			return
		case <-stop:
			return
		}
	}
}
