package paxos

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// The learner. A follower learns that slot s is chosen when a leader at
// ballot b says its commit is at or past s and the follower's own accepted
// entry for s has ballot b (the leader proposes one value per slot per
// ballot). A gap, an entry of another ballot or a missing one makes it ask
// CatchUp{Slot: commit+1}; any node answers with its chosen entries from
// there (at most maxCatchUp), or with its snapshot when those entries
// were truncated. A joining node with an empty log asks CatchUp{Slot: 0}
// and gets a snapshot of the current state: it must not replay the
// earlier membership changes against the members it was started with.
// Chosen slots are applied in order to the table; the
// Propose waiting for the command's ID gets the result. Once the log
// above the last snapshot holds SnapshotEvery applied entries and a
// quarter of that snapshot's items, the table is snapshotted (in the
// background) and the log truncated.

// maxCatchUp bounds the entries of one catch-up reply.
const maxCatchUp = 1000

// wait is a local Propose (or several with the same ID) waiting for its
// command to be applied here.
type wait struct {
	cmd    Command
	reqs   []*request
	sentAt time.Time
}

// onPropose takes a Propose: the leader queues it, a follower forwards it
// to the leader, and both wait for the local apply.
func (n *Node) onPropose(req *request) {
	if n.role == roleRemoved {
		req.ch <- proposeResult{err: ErrRemoved}
		return
	}
	if w := n.waits[req.cmd.ID]; w != nil {
		w.reqs = append(w.reqs, req)
		return
	}
	w := &wait{cmd: req.cmd, reqs: []*request{req}}
	n.waits[req.cmd.ID] = w
	n.route(w, time.Now())
}

// route sends a waiting command to the leader, if one is known.
func (n *Node) route(w *wait, now time.Time) {
	switch {
	case n.lead != nil:
		n.enqueue(w.cmd)
	case n.hasLeader && n.leader != n.cfg.ID:
		n.forwards[n.leader] = append(n.forwards[n.leader], w.cmd)
	default:
		return // retried on a tick, or when a leader shows up
	}
	w.sentAt = now
}

// sendForwards sends the commands collected for the leader, batched.
func (n *Node) sendForwards() {
	for to, cmds := range n.forwards {
		for len(cmds) > 0 {
			k := min(len(cmds), n.cfg.MaxBatch)
			n.send(Message{Type: MsgForward, To: to, Commands: cmds[:k]})
			cmds = cmds[k:]
		}
		delete(n.forwards, to)
	}
}

// rerouteWaits re-sends every waiting command (a new leader, or a
// snapshot that may have covered some).
func (n *Node) rerouteWaits(now time.Time) {
	for _, w := range n.waits {
		n.route(w, now)
	}
}

// retryInterval is how long a forwarded command waits for its apply
// before it is sent again.
func (n *Node) retryInterval() time.Duration {
	return max(4*n.cfg.Heartbeat, n.cfg.ElectionTimeout/2)
}

// retryWaits drops the waiters whose context ended and re-sends the
// commands that were not applied within retryInterval.
func (n *Node) retryWaits(now time.Time) {
	for id, w := range n.waits {
		w.reqs = slices.DeleteFunc(w.reqs, func(r *request) bool {
			select {
			case <-r.done:
				return true
			default:
				return false
			}
		})
		if len(w.reqs) == 0 {
			delete(n.waits, id)
			continue
		}
		if now.Sub(w.sentAt) >= n.retryInterval() {
			n.route(w, now)
		}
	}
}

// deliver answers the waiters of id.
func (n *Node) deliver(id string, res Result) {
	w := n.waits[id]
	if w == nil {
		return
	}
	for _, r := range w.reqs {
		r.ch <- proposeResult{res: res}
	}
	delete(n.waits, id)
}

// failWaits answers every waiter with err.
func (n *Node) failWaits(err error) {
	for id, w := range n.waits {
		for _, r := range w.reqs {
			r.ch <- proposeResult{err: err}
		}
		delete(n.waits, id)
	}
}

// learnCommit advances the commit to c where the local entries are the
// ballot-b leader's, and asks from for the rest.
func (n *Node) learnCommit(from NodeID, b Ballot, c uint64, now time.Time) {
	for n.commit < c {
		e, ok := n.entries[n.commit+1]
		if !ok || e.Ballot != b {
			break
		}
		n.commitTo(e.Slot)
	}
	if n.commit < c {
		n.requestCatchUp(from, now)
	}
}

// commitTo marks slot (the one after the commit) chosen and applies it.
func (n *Node) commitTo(slot uint64) {
	n.commit = slot
	e, ok := n.entries[slot]
	if !ok { // every caller checks first: this is a bug, not a fault
		n.fail(fmt.Errorf("paxos: slot %d committed without its entry", slot))
		return
	}
	delete(n.entries, slot)
	n.chosen.push(e)
	n.apply(e)
}

// apply applies one chosen entry: to the table, to the configuration for a
// membership change, to the waiters of its ID; then snapshots if due.
func (n *Node) apply(e Entry) {
	res := n.sm.Apply(e.Slot, e.Cmd)
	var next *config
	if isChange(e.Cmd) && res.Index == e.Slot {
		// A change applies once. The table answers a repeat of its ID
		// (a retry, a redelivered forward) with the first result, Index
		// included; the configuration must not change again, or a late
		// copy of "remove n" would undo a later "add n".
		res, next = n.changeResult(e.Slot, e.Cmd)
		if r, ok := n.sm.(resultRememberer); ok && e.Cmd.ID != "" {
			r.rememberResult(e.Cmd.ID, res)
		}
	}
	n.applied = e.Slot
	if e.Cmd.ID != "" {
		n.deliver(e.Cmd.ID, res)
	}
	n.leaderApplied(e)
	if next != nil {
		n.setConfig(next)
	}
	if !n.snapping && n.applied-n.snapIndex() >= n.snapshotDue() {
		n.takeSnapshot()
	}
}

// snapshotDue is how many entries applied above the last snapshot start
// the next. A node's first snapshot comes later by a third of that for
// each step of its id (modulo 3): the members of a group apply the same
// log, and without the offset they all encoded and wrote their snapshot
// at the same slot, which on shared cores or a shared disk held up every
// node's fsyncs at once (docs/bench-log/paxos.md). The later snapshots keep
// the offset, each coming the same count of entries after the last.
func (n *Node) snapshotDue() uint64 {
	due := max(n.cfg.SnapshotEvery, n.snapItems/snapItemsPerEntry)
	if n.snapIndex() == 0 {
		due += n.snapshotOffset(due)
	}
	return due
}

// snapshotOffset is how much later than after every entries this node's
// first snapshot comes: a third of every per step of its id, modulo 3.
func (n *Node) snapshotOffset(every uint64) uint64 {
	return every * (uint64(n.cfg.ID) % 3) / 3
}

// currentSnapshot is the table and configuration as of the applied index.
func (n *Node) currentSnapshot() (Snapshot, error) {
	data, err := n.sm.Snapshot()
	if err != nil {
		return Snapshot{}, err
	}
	return Snapshot{Index: n.applied, Members: n.conf.peerList(), Data: data}, nil
}

// resultRememberer is a state machine whose remembered result for a
// command ID the node can set: a membership change's result is decided by
// the configuration, which the table does not know, and a repeat of the
// change must get that result.
type resultRememberer interface {
	rememberResult(id string, res Result)
}

// snapItemsPerEntry bounds the snapshot items encoded per applied entry
// (see takeSnapshot).
const snapItemsPerEntry = 4

// snapSaved is the outcome of a snapshot saved in the background.
type snapSaved struct {
	snap Snapshot
	err  error
}

// takeSnapshot starts saving the table as of the applied index. The state
// is captured here, on the loop; encoding it and the synced writes run on
// a goroutine of their own, and snapshotSaved, back on the loop, truncates
// the log below it. A busy group's table remembers every result of the
// dedupe window (at 2,800 writes/s, 840,000 of them: a 42 MB snapshot,
// about 50 ms to encode, a second in the JSON form it once had), which on
// the loop would stall the node. One snapshot is saved at a time.
func (n *Node) takeSnapshot() {
	encode, items := n.captureState()
	snap := Snapshot{Index: n.applied, Members: n.conf.peerList()}
	// The next snapshot waits until the log has a quarter as many entries
	// as this one has items: encoding costs at most snapItemsPerEntry
	// items per entry applied, and the log stays within a quarter of the
	// table.
	n.snapping, n.snapItems = true, uint64(items)
	n.snapWG.Add(1)
	go func() {
		defer n.snapWG.Done()
		data, err := encode()
		if err == nil {
			snap.Data = data
			err = n.store.SaveSnapshot(snap)
		}
		n.snapDone <- snapSaved{snap: snap, err: err} // buffered: one at a time
	}()
}

// captureState captures the state machine for a snapshot: the returned
// function encodes it and may run on another goroutine.
func (n *Node) captureState() (func() ([]byte, error), int) {
	if sl, ok := n.sm.(interface {
		snapshotLater() (func() ([]byte, error), int)
	}); ok {
		return sl.snapshotLater()
	}
	data, err := n.sm.Snapshot()
	return func() ([]byte, error) { return data, err }, 0
}

// snapshotSaved takes a background snapshot's outcome on the loop.
func (n *Node) snapshotSaved(r snapSaved) {
	n.snapping = false
	switch {
	case errors.Is(r.err, errSnapshotOlder):
		return // a peer's newer snapshot was installed meanwhile
	case r.err != nil:
		n.fail(r.err)
		return
	case r.snap.Index <= n.snapIndex():
		return
	}
	n.snap = &r.snap
	n.savedCommit = max(n.savedCommit, r.snap.Index)
	// The last trailing() entries at and below the snapshot stay, so
	// that a peer a little behind catches up from them rather than with
	// the whole snapshot (which, large, it would install on its loop).
	cut := r.snap.Index - min(r.snap.Index, n.trailing())
	n.chosen.dropThrough(cut) // the map holds slots above the commit only
	n.trailFrom = max(n.trailFrom, cut)
	n.log.Debug("snapshot", "index", r.snap.Index)
}

// fail records an error that halts the node at the end of the round.
func (n *Node) fail(err error) {
	if n.failed == nil {
		n.failed = err
	}
}

// requestCatchUp asks to for the chosen entries after the commit; one
// request at a time, re-sent after catchUpTimeout.
func (n *Node) requestCatchUp(to NodeID, now time.Time) {
	if n.catchPending && now.Sub(n.catchAt) < n.catchUpTimeout() {
		return
	}
	n.catchPending, n.catchAt = true, now
	slot := n.commit + 1
	if n.commit == 0 && !n.everMember {
		// Joining, with an empty log: this node was started with the
		// current members, not the group's first ones, and replaying the
		// log from slot 1 against them would apply every earlier
		// membership change to the wrong configuration. Slot 0 asks for
		// the whole state instead.
		slot = 0
	}
	n.send(Message{Type: MsgCatchUp, To: to, Slot: slot})
}

func (n *Node) catchUpTimeout() time.Duration { return 4 * n.cfg.Heartbeat }

// onCatchUp answers with chosen entries from m.Slot, or the snapshot when
// they were truncated.
func (n *Node) onCatchUp(m Message) {
	reply := Message{Type: MsgCatchUpReply, To: m.From, Ballot: n.promised, Commit: n.commit}
	n.log.Debug("catch-up request", "from", m.From, "slot", m.Slot, "snapshot", n.snapIndex(), "commit", n.commit)
	switch {
	case m.Slot == 0:
		// A joining node with an empty log (see requestCatchUp) gets the
		// whole state, configuration included.
		if n.applied > 0 {
			snap, err := n.currentSnapshot()
			if err != nil {
				n.log.Warn("catch-up: snapshot for a joining node failed", "to", m.From, "err", err)
				return
			}
			reply.Snapshot = &snap
		}
	case n.snap != nil && m.Slot <= n.snap.Index && !n.retains(m.Slot):
		reply.Snapshot = n.snap
	default:
		for s := m.Slot; s <= n.commit && len(reply.Entries) < maxCatchUp; s++ {
			e, ok := n.entry(s)
			if !ok {
				break
			}
			reply.Entries = append(reply.Entries, e)
		}
	}
	if reply.Snapshot != nil {
		n.snapsSent++
	}
	n.send(reply)
}

// retains reports whether the chosen entries from slot s to the commit
// are still in memory, though at or below the snapshot (see trailing). It
// looks at slot s only: entries are deleted only up to a cut, which raises
// trailFrom, so those above it up to the commit have no gap.
func (n *Node) retains(s uint64) bool {
	return n.chosen.has(s) && s > n.trailFrom // chosen holds applied slots only
}

// onCatchUpReply learns chosen entries (or a snapshot) and asks for more
// while the sender is ahead. A candidate that was behind campaigns again
// once caught up.
func (n *Node) onCatchUpReply(m Message, now time.Time) error {
	if n.lead != nil {
		return nil
	}
	n.catchPending = false
	if m.Snapshot != nil && m.Snapshot.Index > n.commit {
		if err := n.installSnapshot(*m.Snapshot, now); err != nil {
			return err
		}
	}
	for _, e := range m.Entries {
		if e.Slot <= n.commit {
			continue
		}
		if e.Slot != n.commit+1 {
			break
		}
		n.learnChosen(e)
		n.commitTo(e.Slot)
	}
	if c := n.cand; c != nil && c.behindTo > 0 && n.commit >= c.behindTo {
		return n.campaign(now)
	}
	if n.commit < m.Commit {
		n.requestCatchUp(m.From, now)
	}
	return nil
}

// learnChosen stores the chosen entry e as accepted. Its ballot never goes
// down: a lower stamp could let a later candidate prefer another value
// accepted at a ballot between the two.
func (n *Node) learnChosen(e Entry) {
	old, ok := n.entries[e.Slot]
	if ok && old.Ballot == e.Ballot && old.Cmd.ID == e.Cmd.ID && old.Cmd.Op == e.Cmd.Op {
		return
	}
	if ok && e.Ballot.Less(old.Ballot) {
		e.Ballot = old.Ballot
	}
	n.putEntry(e)
}

// installSnapshot replaces the table and log up to snap.Index with a
// snapshot from another node.
func (n *Node) installSnapshot(snap Snapshot, now time.Time) error {
	if err := n.sync(); err != nil {
		return err
	}
	if snap.Index <= n.commit {
		return nil // the writes released just now applied as far
	}
	if err := n.sm.Restore(snap.Data); err != nil {
		n.log.Warn("snapshot from a peer refused", "index", snap.Index, "err", err)
		return nil
	}
	if err := n.store.SaveSnapshot(snap); err != nil {
		return err
	}
	n.snap = &snap
	n.commit, n.applied = snap.Index, snap.Index
	n.savedCommit = max(n.savedCommit, snap.Index)
	for s := range n.entries {
		if s <= snap.Index {
			delete(n.entries, s)
		}
	}
	n.chosen = chosenLog{} // all at or below the commit, below snap.Index
	n.trailFrom = max(n.trailFrom, snap.Index)
	n.snapsIn++
	n.log.Info("installed snapshot", "index", snap.Index)
	n.setConfig(newConfig(snap.Members))
	// Commands applied inside the snapshot answer their waiters when
	// re-sent: the table remembers their results by ID.
	n.rerouteWaits(now)
	return nil
}

// restore rebuilds the node from its data dir: the snapshot, then the
// entries known chosen (up to the persisted commit). Entries above it are
// kept as acceptor state; whether they were chosen is learned from the
// group.
func (n *Node) restore(st State) error {
	n.promised, n.maxRound = st.Promised, st.Promised.Round
	members := st.Members
	n.everMember = newConfig(st.Members).has(n.cfg.ID)
	if st.Snapshot != nil {
		if err := n.sm.Restore(st.Snapshot.Data); err != nil {
			return err
		}
		snap := *st.Snapshot
		n.snap = &snap
		n.commit, n.applied = snap.Index, snap.Index
		n.trailFrom = snap.Index
		members = snap.Members
	}
	n.conf = newConfig(members)
	if n.conf.has(n.cfg.ID) {
		n.everMember = true
	}
	for _, e := range st.Entries {
		if e.Slot > n.commit {
			n.entries[e.Slot] = e
			n.maxRound = max(n.maxRound, e.Ballot.Round)
		}
	}
	for n.commit < st.Commit {
		if _, ok := n.entries[n.commit+1]; !ok {
			break
		}
		n.commitTo(n.commit + 1)
	}
	if n.failed != nil {
		return n.failed
	}
	if n.commit < st.Commit {
		n.log.Warn("log shorter than the recorded commit; the rest is learned from the group",
			"commit", st.Commit, "applied", n.commit)
	}
	n.savedCommit = n.commit
	if !n.conf.has(n.cfg.ID) && n.everMember {
		n.role = roleRemoved
	}
	return nil
}

// trailing is how many entries at and below a snapshot stay in memory for
// catch-ups: the node's first snapshot interval (SnapshotEvery, and its
// offset, see snapshotDue), so that every member still holds the group's
// first entries after its first snapshot, and the log in memory holds at
// most about twice what it held between snapshots (hashicorp/raft's
// TrailingLogs has the same purpose).
func (n *Node) trailing() uint64 {
	return n.cfg.SnapshotEvery + n.snapshotOffset(n.cfg.SnapshotEvery)
}
