package paxos

import (
	"container/heap"
	"errors"
	"math/rand/v2"
	"sync"
	"time"
)

// MemNetwork is an in-process network that connects the nodes of a group
// in tests and benchmarks, and breaks on purpose: it drops, duplicates and
// delays (hence reorders) messages at configurable rates, partitions the
// group and isolates nodes. Every message is encoded and decoded as a
// real transport would, so each receiver gets its own copy. Its faults
// come from one seeded random source, so a seed replays the same choices
// for the same sequence of sends. It ships in the package as a test aid;
// production groups use the AMQP or direct transport.
//
// Close it when done: delayed messages are delivered by one goroutine
// that Close ends.
type MemNetwork struct {
	mu        sync.Mutex
	rng       *rand.Rand
	drop, dup float64
	minDelay  time.Duration
	maxDelay  time.Duration
	inboxSize int
	nodes     map[NodeID]*memTransport
	side      map[NodeID]int // partition side; absent is side 0
	isolated  map[NodeID]bool
	queue     memQueue
	seq       uint64
	running   bool
	closed    bool
	wake      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	stats     MemStats
}

// MemStats counts what a MemNetwork did with the messages sent on it.
type MemStats struct {
	Sent       uint64 // Send calls that were accepted
	Delivered  uint64 // copies put in an inbox
	Dropped    uint64 // lost on purpose (drop rate, partition, isolation) or to a closed or unknown endpoint
	Duplicated uint64 // extra copies made on purpose
	Overflow   uint64 // lost because the receiver's inbox was full
}

// MemOption configures a MemNetwork.
type MemOption func(*MemNetwork)

// MemDropRate makes the network lose each message with probability p.
func MemDropRate(p float64) MemOption { return func(n *MemNetwork) { n.drop = p } }

// MemDuplicateRate makes the network deliver each message twice with
// probability p.
func MemDuplicateRate(p float64) MemOption { return func(n *MemNetwork) { n.dup = p } }

// MemDelay delays each message by a random duration in [lo, hi], which
// reorders messages whose delays differ.
func MemDelay(lo, hi time.Duration) MemOption {
	return func(n *MemNetwork) { n.minDelay, n.maxDelay = lo, max(lo, hi) }
}

// MemSeed seeds the network's random choices.
func MemSeed(seed uint64) MemOption {
	return func(n *MemNetwork) { n.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }
}

// MemInboxSize sets each node's inbox capacity (default 4096); a message
// to a full inbox is lost.
func MemInboxSize(size int) MemOption { return func(n *MemNetwork) { n.inboxSize = max(size, 1) } }

// NewMemNetwork returns a network without faults unless opts add some.
func NewMemNetwork(opts ...MemOption) *MemNetwork {
	n := &MemNetwork{
		rng:       rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1)),
		inboxSize: 4096,
		nodes:     map[NodeID]*memTransport{},
		side:      map[NodeID]int{},
		isolated:  map[NodeID]bool{},
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

// Transport returns node id's endpoint. Called again for the same id it
// returns the same endpoint, or a new one if that was closed (a node
// restarted with a fresh transport).
func (n *MemNetwork) Transport(id NodeID) Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t := n.nodes[id]; t != nil && !t.isClosed() {
		return t
	}
	t := &memTransport{net: n, id: id, ch: make(chan Message, n.inboxSize)}
	n.nodes[id] = t
	return t
}

// SetDropRate changes the drop rate.
func (n *MemNetwork) SetDropRate(p float64) { n.mu.Lock(); n.drop = p; n.mu.Unlock() }

// SetDuplicateRate changes the duplicate rate.
func (n *MemNetwork) SetDuplicateRate(p float64) { n.mu.Lock(); n.dup = p; n.mu.Unlock() }

// SetDelay changes the delay range.
func (n *MemNetwork) SetDelay(lo, hi time.Duration) {
	n.mu.Lock()
	n.minDelay, n.maxDelay = lo, max(lo, hi)
	n.mu.Unlock()
}

// Partition splits the network in two: ids on one side, every other node
// on the other. Messages between the sides are lost until Heal. A new
// Partition replaces the previous one.
func (n *MemNetwork) Partition(ids ...NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.side)
	for _, id := range ids {
		n.side[id] = 1
	}
}

// Isolate cuts node id off: it sends and receives nothing until Heal.
func (n *MemNetwork) Isolate(id NodeID) { n.mu.Lock(); n.isolated[id] = true; n.mu.Unlock() }

// Heal ends every partition and isolation.
func (n *MemNetwork) Heal() {
	n.mu.Lock()
	clear(n.side)
	clear(n.isolated)
	n.mu.Unlock()
}

// Stats returns the counters so far.
func (n *MemNetwork) Stats() MemStats { n.mu.Lock(); defer n.mu.Unlock(); return n.stats }

// Close stops delivering: delayed messages are dropped and the delivery
// goroutine ends. Endpoints stay open (their owners close them). Safe to
// call twice.
func (n *MemNetwork) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	running := n.running
	n.queue = nil
	n.mu.Unlock()
	close(n.stop)
	if running {
		<-n.done
	}
	return nil
}

var errMemClosed = errors.New("paxos: mem transport closed")

// send routes one message from a node's endpoint: the faults are decided
// under the lock, the copies decoded and delivered outside it.
func (n *MemNetwork) send(m Message) error {
	b, err := Encode(m)
	if err != nil {
		return err
	}
	var delays [2]time.Duration
	copies := 1
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return errMemClosed
	}
	n.stats.Sent++
	if n.isolated[m.From] || n.isolated[m.To] || n.side[m.From] != n.side[m.To] || n.rng.Float64() < n.drop {
		n.stats.Dropped++
		n.mu.Unlock()
		return nil
	}
	if n.rng.Float64() < n.dup {
		copies = 2
		n.stats.Duplicated++
	}
	for i := range copies {
		delays[i] = n.minDelay
		if n.maxDelay > n.minDelay {
			delays[i] += time.Duration(n.rng.Int64N(int64(n.maxDelay - n.minDelay + 1)))
		}
	}
	n.mu.Unlock()
	for _, d := range delays[:copies] {
		c, err := Decode(b)
		if err != nil {
			return err
		}
		if d <= 0 {
			n.deliver(c)
			continue
		}
		n.mu.Lock()
		if !n.closed {
			n.seq++
			heap.Push(&n.queue, memItem{at: time.Now().Add(d), seq: n.seq, m: c})
			n.startLocked()
		}
		n.mu.Unlock()
	}
	return nil
}

// deliver puts m in its receiver's inbox, or loses it when the inbox is
// full or closed.
func (n *MemNetwork) deliver(m Message) {
	n.mu.Lock()
	t := n.nodes[m.To]
	n.mu.Unlock()
	full := false
	ok := t != nil && t.offer(m, &full)
	n.mu.Lock()
	switch {
	case ok:
		n.stats.Delivered++
	case full:
		n.stats.Overflow++
	default:
		n.stats.Dropped++
	}
	n.mu.Unlock()
}

// startLocked starts the delivery goroutine once, and wakes it.
func (n *MemNetwork) startLocked() {
	if !n.running {
		n.running = true
		go n.deliverLoop()
	}
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// deliverLoop delivers delayed messages when they fall due.
func (n *MemNetwork) deliverLoop() {
	defer close(n.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []Message
	for {
		n.mu.Lock()
		now := time.Now()
		for len(n.queue) > 0 && !n.queue[0].at.After(now) {
			due = append(due, heap.Pop(&n.queue).(memItem).m)
		}
		wait := time.Hour
		if len(n.queue) > 0 {
			wait = n.queue[0].at.Sub(now)
		}
		n.mu.Unlock()
		for _, m := range due {
			n.deliver(m)
		}
		due = due[:0]
		timer.Reset(wait)
		select {
		case <-n.stop:
			return
		case <-n.wake:
		case <-timer.C:
		}
	}
}

// memItem is a delayed message.
type memItem struct {
	at  time.Time
	seq uint64
	m   Message
}

// memQueue is a min-heap of delayed messages by due time.
type memQueue []memItem

func (q memQueue) Len() int { return len(q) }
func (q memQueue) Less(i, j int) bool {
	if q[i].at.Equal(q[j].at) {
		return q[i].seq < q[j].seq
	}
	return q[i].at.Before(q[j].at)
}
func (q memQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *memQueue) Push(x any)   { *q = append(*q, x.(memItem)) }
func (q *memQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// memTransport is one node's endpoint on a MemNetwork.
type memTransport struct {
	net    *MemNetwork
	id     NodeID
	mu     sync.Mutex
	ch     chan Message
	closed bool
}

// Send hands m to the network; it never blocks.
func (t *memTransport) Send(m Message) error {
	if t.isClosed() {
		return errMemClosed
	}
	m.From = t.id
	return t.net.send(m)
}

// Recv is the node's inbox.
func (t *memTransport) Recv() <-chan Message { return t.ch }

// SetPeers does nothing: every node of a MemNetwork can reach every other.
func (t *memTransport) SetPeers([]Peer) {}

// Close closes the inbox. Safe to call twice.
func (t *memTransport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		close(t.ch)
	}
	return nil
}

func (t *memTransport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// offer puts m in the inbox unless it is closed or full (then *full is
// set).
func (t *memTransport) offer(m Message, full *bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	select {
	case t.ch <- m:
		return true
	default:
		*full = true
		return false
	}
}
