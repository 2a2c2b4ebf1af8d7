package paxos

import (
	"sort"
	"time"
)

// The acceptor's rules. Every reply that depends on acceptor state is sent
// only after that state is durable: a promise is fsynced before the
// Promise goes out; accepted entries are collected in n.unsynced and the
// Accepted replies in n.outbox, and flush hands the one to the writer and
// holds the other until the writer says the write is durable (writer.go). Every handler is idempotent: a duplicated, delayed or
// reordered message is judged by its ballot and slots and changes nothing
// it should not.

// onPrepare answers phase 1: Prepare{Ballot, Slot: the candidate's
// commit+1} gets Promise{Ballot, Entries: accepted entries from Slot on,
// Commit, Slot: this node's snapshot index} when Ballot is at or above
// every ballot promised, else Nack{Ballot: the promise}.
func (n *Node) onPrepare(m Message, now time.Time) error {
	// Every write in flight ends first (the Promise reports the accepted
	// entries, durable), and before the checks below: releasing them may
	// apply entries, a removal of this node among them.
	if err := n.sync(); err != nil {
		return err
	}
	if n.role == roleRemoved {
		return nil
	}
	if !n.conf.has(m.From) {
		// Not a member here: a removed node that has not learned it (tell
		// it how far the log is), or we are behind a change that added it
		// (learn from it).
		n.nonMember(m, now)
		return nil
	}
	if m.Ballot.Less(n.promised) {
		n.send(Message{Type: MsgNack, To: m.From, Ballot: n.promised, Commit: n.commit})
		return nil
	}
	if n.promised.Less(m.Ballot) {
		if err := n.store.SetPromised(m.Ballot); err != nil {
			return err
		}
		n.promised = m.Ballot
	}
	if n.proposerBallot().Less(m.Ballot) && n.role != roleFollower {
		n.stepDown(now)
	}
	// The candidate may be about to lead: stop forwarding to a deposed
	// leader (unless the candidate is that leader, running phase 1 again:
	// it is still the leader this node hears), and end a vote of our own
	// before a campaign (the majority let this campaign start). The
	// election timer is not restarted: only a live leader's heartbeat or
	// Accept does that, so a candidate that never wins (one that cannot
	// hear the answers) does not hold the others back.
	if m.From != n.leader {
		n.hasLeader = false
	}
	n.pre = nil
	n.send(Message{
		Type: MsgPromise, To: m.From, Ballot: m.Ballot,
		// Entries at or below the snapshot (kept for catch-ups) are of no
		// use to the candidate: one behind the snapshot catches up first.
		Entries: n.entriesFrom(max(m.Slot, n.snapIndex()+1)), Commit: n.commit, Slot: n.snapIndex(),
	})
	return nil
}

// onPrePrepare answers the vote before a campaign (election.go):
// PrePrepare{Slot, Commit, Seq} gets PrePromise{Ballot: the promise,
// Seq} unless this node hears a leader other than the sender, else
// Nack{Ballot: the promise, Commit, Seq}. It changes no state: a refused
// node that is behind catches up from the Nack's commit, and the
// promise's round lets a granted campaign pick a ballot above it.
func (n *Node) onPrePrepare(m Message, now time.Time) {
	if n.role == roleRemoved {
		return
	}
	if !n.conf.has(m.From) {
		n.nonMember(m, now)
		return
	}
	t := MsgPrePromise
	if n.hearsLeader(m.From, now) {
		t = MsgNack
		n.log.Debug("refused a vote before a campaign: the leader is heard", "from", m.From, "leader", n.leader)
	}
	n.send(Message{Type: t, To: m.From, Ballot: n.promised, Commit: n.commit, Seq: m.Seq})
}

// nonMember answers a Prepare or PrePrepare from a node outside this
// configuration.
func (n *Node) nonMember(m Message, now time.Time) {
	if m.Slot > n.commit+1 {
		n.requestCatchUp(m.From, now)
		return
	}
	n.send(Message{Type: MsgNack, To: m.From, Ballot: n.promised, Commit: n.commit})
}

// onAccept answers phase 2: Accept{Ballot, Entries (contiguous slots),
// Commit} at or above the promise is accepted, persisted, and answered
// Accepted{Ballot, Slot, Last} after the persist; below it, Nack.
func (n *Node) onAccept(m Message, now time.Time) {
	if n.role == roleRemoved || len(m.Entries) == 0 {
		return
	}
	if m.Ballot.Less(n.promised) {
		n.send(Message{Type: MsgNack, To: m.From, Ballot: n.promised, Commit: n.commit})
		return
	}
	n.observeLeader(m.From, m.Ballot, now)
	if n.promised.Less(m.Ballot) {
		n.promised, n.promiseDirt = m.Ballot, true
	}
	for _, e := range m.Entries {
		if e.Slot <= n.commit {
			continue // chosen already: the value is the same
		}
		if old, ok := n.entries[e.Slot]; ok && old.Ballot == e.Ballot {
			continue // a duplicate
		}
		n.putEntry(e)
	}
	first, last := m.Entries[0].Slot, m.Entries[len(m.Entries)-1].Slot
	n.outbox = append(n.outbox, Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Slot: first, Last: last})
	n.learnCommit(m.From, m.Ballot, m.Commit, now)
}

// onHeartbeat: a leader at or above the promise resets the election timer
// and says how far the log is chosen; it is answered with this node's
// commit (when the leader asked, Seq != 0). A stale leader gets a Nack.
// The promise rises to the leader's ballot (persisted with the next
// write), so an older leader still sending is refused rather than
// followed.
func (n *Node) onHeartbeat(m Message, now time.Time) {
	if n.role == roleRemoved {
		// A removed node does not vote or follow, but it keeps learning
		// the chosen log: a leader that heartbeats it has added it back,
		// and it must apply that change to vote again.
		if m.Commit > n.commit {
			n.requestCatchUp(m.From, now)
		}
		return
	}
	if m.Ballot.Less(n.promised) {
		n.send(Message{Type: MsgNack, To: m.From, Ballot: n.promised, Commit: n.commit})
		return
	}
	n.observeLeader(m.From, m.Ballot, now)
	if n.promised.Less(m.Ballot) {
		n.promised, n.promiseDirt = m.Ballot, true
	}
	n.learnCommit(m.From, m.Ballot, m.Commit, now)
	if m.Seq != 0 {
		n.send(Message{Type: MsgHeartbeatAck, To: m.From, Ballot: m.Ballot, Slot: n.commit, Seq: m.Seq})
	}
}

// observeLeader notes that from leads at ballot b (b is at or above the
// promise): a proposer with a lower ballot steps down, the election
// timer restarts, and a leader change re-sends the waiting proposals.
func (n *Node) observeLeader(from NodeID, b Ballot, now time.Time) {
	if n.role == roleLeader || n.role == roleCandidate {
		if !n.proposerBallot().Less(b) {
			return
		}
		n.stepDown(now)
	}
	n.resetElection(now)
	n.health.lastLeader, n.leaderTicks = now, 0
	n.pre = nil // a leader is heard: no campaign
	if n.hasLeader && n.leader == from {
		return
	}
	n.leader, n.hasLeader = from, true
	n.log.Debug("leader", "leader", from, "ballot", b)
	n.rerouteWaits(now)
}

// putEntry accepts e in memory; flush persists it.
func (n *Node) putEntry(e Entry) {
	n.entries[e.Slot] = e
	n.unsynced = append(n.unsynced, e)
	if e.Ballot.Round > n.maxRound {
		n.maxRound = e.Ballot.Round
	}
}

// entriesFrom returns the accepted entries with slot >= from, by slot:
// the chosen ones kept, then those not yet applied.
func (n *Node) entriesFrom(from uint64) []Entry {
	var out []Entry
	if k := n.chosen.len(); k > 0 {
		for s := max(from, n.chosen.first); s < n.chosen.first+uint64(k); s++ {
			if e, ok := n.chosen.get(s); ok {
				out = append(out, e)
			}
		}
	}
	chosen := len(out)
	for s, e := range n.entries {
		if s >= from {
			out = append(out, e)
		}
	}
	rest := out[chosen:]
	sort.Slice(rest, func(i, j int) bool { return rest[i].Slot < rest[j].Slot })
	return out
}

// entry is the entry the node keeps at slot s, applied (in chosen) or
// not (in the map).
func (n *Node) entry(s uint64) (Entry, bool) {
	if s <= n.commit {
		return n.chosen.get(s)
	}
	e, ok := n.entries[s]
	return e, ok
}

// snapIndex is the index of the latest snapshot (0 if none).
func (n *Node) snapIndex() uint64 {
	if n.snap == nil {
		return 0
	}
	return n.snap.Index
}

// proposerBallot is the ballot this node leads or campaigns with (zero
// when it does neither).
func (n *Node) proposerBallot() Ballot {
	switch {
	case n.lead != nil:
		return n.lead.ballot
	case n.cand != nil:
		return n.cand.ballot
	}
	return Ballot{}
}
