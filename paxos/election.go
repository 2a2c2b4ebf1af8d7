package paxos

import (
	"time"
)

// Elections. A follower that hears no leader for a random time in
// [T, 2T) campaigns: it promises itself a ballot (max round seen + 1,
// self) and sends Prepare{Ballot, Slot: commit+1} to the members. With
// promises from a majority of every configuration the undecided slots
// lead to, it is leader: each undecided slot gets the accepted value with
// the highest ballot among the promises, or a no-op. A candidate or
// leader that meets a higher ballot (a Nack, a Prepare, an Accept or a
// heartbeat) steps down and waits a new random time before it competes
// again, so two proposers do not keep pre-empting each other.
//
// Three rules keep a node that cannot hear the group (a one-way failure)
// from holding it still. A leader that has heard from no majority for two
// election timeouts steps down: its heartbeats would otherwise keep the
// others from ever electing a leader that can commit. A Prepare never
// restarts an election timer (only a live leader's heartbeat or Accept
// does), so a candidate that cannot win does not hold the others back.
// And a campaign that no other node answered is not followed by one with
// a higher ballot, only by the same Prepare again: a candidate that hears
// nothing would otherwise climb above every ballot and depose each leader
// the others elect.

// candidate is the state of a campaign.
type candidate struct {
	ballot   Ballot
	promises map[NodeID]Message
	asked    map[NodeID]bool
	// behindTo is set when a promiser's snapshot is past our commit: we
	// catch up to it before we may lead, then campaign again.
	behindTo uint64
	// heard is set when another node promised this ballot.
	heard bool
}

// resetElection restarts the election timer with a random wait in [T, 2T).
func (n *Node) resetElection(now time.Time) {
	n.electAt = now.Add(n.randBetween(n.cfg.ElectionTimeout))
}

// campaign starts phase 1 with a new ballot.
func (n *Node) campaign(now time.Time) error {
	// Every write in flight ends first: the promise to itself reports the
	// accepted entries, and releasing the writes may apply a removal.
	if err := n.sync(); err != nil {
		return err
	}
	if n.role == roleRemoved || !n.conf.has(n.cfg.ID) {
		n.resetElection(now)
		return nil
	}
	b := Ballot{Round: max(n.maxRound, n.promised.Round) + 1, Node: n.cfg.ID}
	if err := n.store.SetPromised(b); err != nil {
		return err
	}
	n.maxRound, n.promised = b.Round, b
	n.lead = nil
	n.role = roleCandidate
	n.hasLeader = false
	n.resetElection(now)
	c := &candidate{ballot: b, promises: map[NodeID]Message{}, asked: map[NodeID]bool{}}
	n.cand = c
	n.log.Debug("campaign", "ballot", b, "commit", n.commit)
	c.promises[n.cfg.ID] = Message{
		Type: MsgPromise, From: n.cfg.ID, Ballot: b,
		Entries: n.entriesFrom(n.commit + 1), Commit: n.commit, Slot: n.snapIndex(),
	}
	for _, p := range n.conf.peers {
		n.askPromise(p.ID)
	}
	n.tryWin(now)
	return nil
}

// electionTimeout runs when the election timer fires: a new campaign,
// unless the current one was answered by nobody. Then the same Prepare
// goes out again (the ballot was never led with, so reusing it is safe):
// a higher one would only climb above the ballots of nodes that can
// hear each other.
func (n *Node) electionTimeout(now time.Time) error {
	if c := n.cand; c != nil && !c.heard {
		n.resetElection(now)
		n.repeatPrepares()
		return nil
	}
	return n.campaign(now)
}

// askPromise sends the campaign's Prepare to id once.
func (n *Node) askPromise(id NodeID) {
	c := n.cand
	if id == n.cfg.ID || c.asked[id] {
		return
	}
	c.asked[id] = true
	n.send(Message{Type: MsgPrepare, To: id, Ballot: c.ballot, Slot: n.commit + 1})
}

// repeatPrepares re-sends the campaign's Prepare to the members that have
// not answered (the transport may have lost it).
func (n *Node) repeatPrepares() {
	c := n.cand
	for id := range c.asked {
		if _, ok := c.promises[id]; !ok {
			n.send(Message{Type: MsgPrepare, To: id, Ballot: c.ballot, Slot: n.commit + 1})
		}
	}
}

// onPromise counts a promise for the current campaign.
func (n *Node) onPromise(m Message, now time.Time) error {
	if n.role != roleCandidate || m.Ballot != n.cand.ballot {
		return nil // a late or duplicated promise
	}
	n.cand.promises[m.From] = m
	n.cand.heard = true
	n.tryWin(now)
	return nil
}

// tryWin becomes leader if the promises allow it.
func (n *Node) tryWin(now time.Time) {
	c := n.cand
	if c.behindTo > 0 {
		return
	}
	for id, p := range c.promises {
		if p.Slot > n.commit {
			// Its log starts after slots we have not learned: learn them
			// (they are chosen) from it, then campaign again.
			c.behindTo = p.Slot
			n.requestCatchUp(id, now)
			return
		}
	}
	vals, top := n.recoverSlots()
	voted := func(id NodeID) bool { _, ok := c.promises[id]; return ok }
	conf := n.conf
	for s := n.commit; ; s++ {
		if s == n.commit || isChange(vals[s].Cmd) {
			if s > n.commit {
				conf, _ = conf.apply(vals[s].Cmd)
			}
			if !conf.majority(voted) {
				for _, p := range conf.peers {
					n.askPromise(p.ID)
				}
				return
			}
		}
		if s >= top {
			break
		}
	}
	n.becomeLeader(vals, top, now)
}

// recoverSlots returns, for each slot above the commit that any promise
// reports, the accepted entry with the highest ballot, and the highest
// such slot (the commit when there is none).
func (n *Node) recoverSlots() (map[uint64]Entry, uint64) {
	vals := map[uint64]Entry{}
	top := n.commit
	for _, p := range n.cand.promises {
		for _, e := range p.Entries {
			if e.Slot <= n.commit {
				continue
			}
			if cur, ok := vals[e.Slot]; !ok || cur.Ballot.Less(e.Ballot) {
				vals[e.Slot] = e
			}
			top = max(top, e.Slot)
		}
	}
	return vals, top
}

// onNack: a higher ballot exists. A proposer below it steps down. A Nack
// from a node ahead of us also tells us to catch up.
func (n *Node) onNack(m Message, now time.Time) {
	if m.Commit > n.commit && n.role != roleLeader {
		n.requestCatchUp(m.From, now)
	}
	if !n.conf.has(m.From) {
		return
	}
	if (n.role == roleLeader || n.role == roleCandidate) && n.proposerBallot().Less(m.Ballot) {
		n.log.Debug("pre-empted", "ballot", n.proposerBallot(), "by", m.Ballot)
		n.stepDown(now)
	}
}

// stepDown makes a leader or candidate a follower that waits a random
// [T, 2T) before it campaigns again. Commands it was proposing stay with
// their waiters, which re-send them (same ID) to the next leader.
func (n *Node) stepDown(now time.Time) {
	if n.role == roleLeader {
		n.log.Info("stepping down", "ballot", n.lead.ballot)
	}
	n.role = roleFollower
	n.lead, n.cand = nil, nil
	n.hasLeader = false
	n.resetElection(now)
}

// campaignNow asks the run loop to campaign at once (what an election
// timeout does). It does not wait.
func (n *Node) campaignNow() {
	select {
	case n.kickc <- struct{}{}:
	default:
	}
}
