package paxos

import (
	"slices"
	"time"
)

// The leader. Phase 1 ran once for every slot above the commit (see
// election.go); from then on the leader runs phase 2 per batch: every
// command waiting when a batch goes out (up to MaxBatch) gets the next
// slot and a Time, its own acceptor takes the batch (persisted in the
// round's one fsync) and the other members get Accept{Ballot, Entries,
// Commit}. Up to maxPipeline batches are in flight at once; what arrives
// meanwhile waits for the next batch, so the batch grows with the load.
// A slot is chosen when a majority of the configuration in effect for it
// accepted it; the commit is the highest slot below which all are chosen.

// maxPipeline bounds the batches in flight.
const maxPipeline = 4

// leaderState is what only a leader has.
type leaderState struct {
	ballot Ballot
	first  uint64 // the first slot proposed at ballot
	next   uint64 // the next free slot
	props  map[uint64]*proposal
	// batchEnds are the last slots of the batches in flight.
	batchEnds []uint64
	pending   []Command
	changes   []Command
	// queued are the IDs pending or in flight: a retried forward of one
	// is not proposed twice.
	queued     map[string]bool
	changeSlot uint64 // the undecided membership change, 0 if none
	tickSlot   uint64 // the expiry tick in flight, 0 if none
	tickQueued bool
	lastTime   int64 // the last Time assigned
	match      map[NodeID]uint64
	seen       map[NodeID]time.Time
	seq        uint64
	sentCommit uint64 // the highest commit told to the followers
	// since starts the grace before the quorum check (see quorumLost).
	since time.Time
}

// proposal is one slot the leader proposed and not yet saw chosen.
type proposal struct {
	entry  Entry
	conf   *config // the configuration that chooses the slot
	acks   []NodeID
	sentAt time.Time
	chosen bool
}

// becomeLeader starts leading with the campaign's ballot: it re-proposes
// every undecided slot up to top with the recovered value (a no-op where
// none) and queues a no-op so an entry of its own ballot gets chosen.
func (n *Node) becomeLeader(vals map[uint64]Entry, top uint64, now time.Time) {
	b := n.cand.ballot
	L := &leaderState{
		ballot: b, first: n.commit + 1, next: top + 1,
		props: map[uint64]*proposal{}, queued: map[string]bool{},
		match: map[NodeID]uint64{}, seen: map[NodeID]time.Time{},
		lastTime: n.sm.Now(), since: now,
	}
	n.role, n.cand, n.lead, n.pre = roleLeader, nil, L, nil
	n.leader, n.hasLeader = n.cfg.ID, true
	n.log.Info("leading", "ballot", b, "commit", n.commit, "recovered", top-n.commit)
	conf := n.conf
	var run []Entry
	for s := n.commit + 1; s <= top; s++ {
		cmd := Command{Op: OpNoop, Time: L.lastTime}
		if e, ok := vals[s]; ok {
			cmd = e.Cmd
		}
		L.lastTime = max(L.lastTime, cmd.Time)
		if cmd.ID != "" {
			L.queued[cmd.ID] = true
		}
		if cmd.Op == OpTick {
			L.tickSlot = s
		}
		e := Entry{Slot: s, Ballot: b, Cmd: cmd}
		n.place(e, conf, now)
		run = append(run, e)
		if isChange(cmd) || len(run) == n.cfg.MaxBatch || s == top {
			n.sendAccept(run, conf)
			run = nil
		}
		if isChange(cmd) {
			conf, _ = conf.apply(cmd)
			L.changeSlot = s
		}
	}
	if top > n.commit {
		L.batchEnds = append(L.batchEnds, top)
	}
	L.pending = append(L.pending, Command{Op: OpNoop})
	for _, w := range n.waits {
		n.enqueue(w.cmd)
		w.sentAt = now
	}
	n.sendHeartbeats()
}

// enqueue queues a command for the next batch (once per ID).
func (n *Node) enqueue(cmd Command) {
	L := n.lead
	if cmd.ID != "" {
		if L.queued[cmd.ID] {
			return
		}
		L.queued[cmd.ID] = true
	}
	if isChange(cmd) {
		L.changes = append(L.changes, cmd)
		return
	}
	L.pending = append(L.pending, cmd)
}

// proposeBatches sends batches while the pipeline has room. A membership
// change ends its batch and stops proposing until it is applied, and it
// waits until an entry of this ballot is chosen (see membership.go).
func (n *Node) proposeBatches(now time.Time) {
	L := n.lead
	for len(L.batchEnds) < maxPipeline && L.changeSlot == 0 {
		k := min(len(L.pending), n.cfg.MaxBatch)
		change := len(L.changes) > 0 && n.commit >= L.first && k < n.cfg.MaxBatch
		if k == 0 && !change {
			return
		}
		batch := make([]Entry, 0, k+1)
		for _, cmd := range L.pending[:k] {
			batch = append(batch, n.stamp(cmd))
		}
		L.pending = L.pending[k:]
		if change {
			e := n.stamp(L.changes[0])
			L.changes = L.changes[1:]
			L.changeSlot = e.Slot
			batch = append(batch, e)
		}
		for _, e := range batch {
			n.place(e, n.conf, now)
		}
		n.sendAccept(batch, n.conf)
		L.batchEnds = append(L.batchEnds, batch[len(batch)-1].Slot)
	}
}

// stamp gives cmd the next slot, its Time (never below the clock's, the
// table's, or any Time assigned before) and this leader's LockDelay.
func (n *Node) stamp(cmd Command) Entry {
	L := n.lead
	t := max(n.cfg.Now().UnixMilli(), n.sm.Now(), L.lastTime)
	cmd.Time, L.lastTime = t, t
	cmd.LockDelay = n.cfg.LockDelay.Milliseconds()
	slot := L.next
	L.next++
	if cmd.Op == OpTick {
		L.tickSlot, L.tickQueued = slot, false
	}
	return Entry{Slot: slot, Ballot: L.ballot, Cmd: cmd}
}

// place records a proposal and has the local acceptor take it (flush
// persists it and then counts it).
func (n *Node) place(e Entry, conf *config, now time.Time) {
	n.lead.props[e.Slot] = &proposal{entry: e, conf: conf, sentAt: now}
	n.putEntry(e)
}

// sendAccept sends phase 2 for a contiguous run of entries to the other
// members of conf.
func (n *Node) sendAccept(run []Entry, conf *config) {
	if len(run) == 0 {
		return
	}
	for _, p := range conf.peers {
		if p.ID != n.cfg.ID {
			n.send(Message{Type: MsgAccept, To: p.ID, Ballot: n.lead.ballot, Entries: run, Commit: n.commit})
		}
	}
	n.lead.sentCommit = max(n.lead.sentCommit, n.commit)
}

// ackOwn counts the local acceptor's acceptance of entries just persisted.
func (n *Node) ackOwn(es []Entry) {
	for _, e := range es {
		if n.lead == nil {
			return
		}
		if e.Ballot == n.lead.ballot {
			n.ack(n.cfg.ID, e.Slot, e.Slot)
		}
	}
}

// onAccepted counts a member's acceptance of Slot..Last.
func (n *Node) onAccepted(m Message, now time.Time) {
	L := n.lead
	if L == nil || m.Ballot != L.ballot || m.Last < m.Slot {
		return
	}
	L.match[m.From] = max(L.match[m.From], m.Last)
	L.seen[m.From] = now
	n.ack(m.From, m.Slot, m.Last)
}

// ack records from's acceptance of first..last and applies what became
// chosen.
func (n *Node) ack(from NodeID, first, last uint64) {
	L := n.lead
	for s := max(first, n.commit+1); s <= last && s < L.next; s++ {
		p := L.props[s]
		if p == nil || p.chosen || !p.conf.has(from) || slices.Contains(p.acks, from) {
			continue
		}
		p.acks = append(p.acks, from)
		p.chosen = len(p.acks) >= p.conf.quorum()
	}
	for n.lead != nil {
		s := n.commit + 1
		p := n.lead.props[s]
		if p == nil || !p.chosen {
			break
		}
		delete(n.lead.props, s)
		n.commitTo(s) // may end the leadership (a removal of this node)
	}
	if n.lead != nil {
		for len(n.lead.batchEnds) > 0 && n.lead.batchEnds[0] <= n.commit {
			n.lead.batchEnds = n.lead.batchEnds[1:]
		}
	}
}

// onHeartbeatAck records a member's progress.
func (n *Node) onHeartbeatAck(m Message, now time.Time) {
	L := n.lead
	if L == nil || m.Ballot != L.ballot {
		return
	}
	L.match[m.From] = max(L.match[m.From], m.Slot)
	L.seen[m.From] = now
}

// onForward queues commands another node forwarded. A node that does not
// lead drops them: their origin re-sends them to the leader it learns.
func (n *Node) onForward(m Message) {
	if n.lead == nil {
		return
	}
	for _, cmd := range m.Commands {
		n.enqueue(cmd)
	}
}

// leaderTick: heartbeats, retransmission of unchosen slots, expiry ticks;
// a leader that no longer hears a majority steps down. gap is the time
// since the loop's last tick.
func (n *Node) leaderTick(now time.Time, gap time.Duration) {
	if n.quorumLost(now, gap) {
		n.log.Warn("no majority heard from: giving up leadership", "ballot", n.lead.ballot,
			"for", n.quorumWindow())
		n.stepDown(now)
		return
	}
	n.sendHeartbeats()
	n.retransmit(now)
	L := n.lead
	if L.tickSlot != 0 || L.tickQueued {
		return
	}
	if ne := n.sm.NextExpiry(); ne != 0 && ne <= n.cfg.Now().UnixMilli() {
		L.tickQueued = true
		L.pending = append(L.pending, Command{Op: OpTick})
	}
}

// quorumWindow is how long a leader may go without hearing from a
// majority of its configuration.
func (n *Node) quorumWindow() time.Duration { return 2 * n.cfg.ElectionTimeout }

// quorumLost reports whether a majority of the configuration (this node
// included, unless its own writes are stuck: see heardMajority) has gone
// unheard (no Accepted, no heartbeat ack) for
// quorumWindow. Such a leader commits nothing; if the others still hear
// its heartbeats (a one-way failure) they never elect another, so it must
// step down. A long gap since the last tick (this loop stalled: the
// process descheduled, a round waiting for a promise's fsync) restarts the
// grace: the replies that waited meanwhile are not read yet.
func (n *Node) quorumLost(now time.Time, gap time.Duration) bool {
	L := n.lead
	window := n.quorumWindow()
	if gap > window/2 {
		L.since = now
	}
	if now.Sub(L.since) < window {
		return false
	}
	return !n.heardMajority(now, window)
}

// heardMajority reports whether the leader heard a majority of the
// configuration within d. It counts itself only if its own writes made
// progress within d (or none are pending): a leader whose disk is stuck
// is no acceptor the majority can count on.
func (n *Node) heardMajority(now time.Time, d time.Duration) bool {
	return n.conf.majority(func(id NodeID) bool {
		if id == n.cfg.ID {
			return !n.writesStuck(now, d)
		}
		return now.Sub(n.lead.seen[id]) < d
	})
}

// sendHeartbeats tells every member the leader lives and how far the log
// is chosen; the acks (Seq != 0) report each member's progress.
func (n *Node) sendHeartbeats() {
	L := n.lead
	L.seq++
	for _, p := range n.conf.peers {
		if p.ID != n.cfg.ID {
			n.send(Message{Type: MsgHeartbeat, To: p.ID, Ballot: L.ballot, Commit: n.commit, Seq: L.seq})
		}
	}
	L.sentCommit = n.commit
}

// announceCommit tells the followers a commit no message carried yet, so
// they apply (and answer their Propose callers) without waiting for the
// next heartbeat.
func (n *Node) announceCommit() {
	if n.commit > n.lead.sentCommit {
		n.broadcastCommit(n.lead.ballot)
		n.lead.sentCommit = n.commit
	}
}

// broadcastCommit sends an unacknowledged heartbeat carrying the commit.
func (n *Node) broadcastCommit(b Ballot) {
	for _, p := range n.conf.peers {
		if p.ID != n.cfg.ID {
			n.send(Message{Type: MsgHeartbeat, To: p.ID, Ballot: b, Commit: n.commit})
		}
	}
}

// retransmit re-sends, to each member that has not accepted them, the
// slots still unchosen two heartbeats after they were last sent (the
// transport may lose messages).
func (n *Node) retransmit(now time.Time) {
	L := n.lead
	rto := 2 * n.cfg.Heartbeat
	var stale []*proposal
	targets := map[NodeID]bool{}
	confs := map[*config]bool{}
	for s := n.commit + 1; s < L.next; s++ {
		if p := L.props[s]; p != nil && !p.chosen && now.Sub(p.sentAt) >= rto {
			stale = append(stale, p)
			if !confs[p.conf] {
				confs[p.conf] = true
				for _, q := range p.conf.peers {
					targets[q.ID] = q.ID != n.cfg.ID
				}
			}
		}
	}
	for id, ok := range targets {
		if !ok {
			continue
		}
		var run []Entry
		for i, p := range stale {
			if !p.conf.has(id) || slices.Contains(p.acks, id) {
				n.sendRun(id, run)
				run = nil
				continue
			}
			if len(run) > 0 && (run[len(run)-1].Slot+1 != p.entry.Slot || len(run) == n.cfg.MaxBatch) {
				n.sendRun(id, run)
				run = nil
			}
			run = append(run, stale[i].entry)
		}
		n.sendRun(id, run)
	}
	for _, p := range stale {
		p.sentAt = now
	}
}

// sendRun sends one Accept of a contiguous run to id.
func (n *Node) sendRun(id NodeID, run []Entry) {
	if len(run) > 0 {
		n.send(Message{Type: MsgAccept, To: id, Ballot: n.lead.ballot, Entries: run, Commit: n.commit})
	}
}

// leaderApplied updates the leader's bookkeeping for an applied entry.
func (n *Node) leaderApplied(e Entry) {
	L := n.lead
	if L == nil {
		return
	}
	if e.Cmd.ID != "" {
		delete(L.queued, e.Cmd.ID)
	}
	if L.changeSlot != 0 && e.Slot >= L.changeSlot {
		L.changeSlot = 0
	}
	if L.tickSlot != 0 && e.Slot >= L.tickSlot {
		L.tickSlot = 0
	}
}
