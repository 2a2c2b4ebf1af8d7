package paxos

import (
	"time"
)

// Elections. A follower that hears no leader for a random time in
// [T, 2T) asks the members whether they hear one (below); with a
// majority that does not, it campaigns: it promises itself a ballot (max
// round seen + 1, self) and sends Prepare{Ballot, Slot: commit+1} to the
// members. With promises from a majority of every configuration the
// undecided slots lead to, it is leader: each undecided slot gets the
// accepted value with the highest ballot among the promises, or a no-op.
// A candidate or leader that meets a higher ballot (a Nack, a Prepare, an
// Accept or a heartbeat) steps down and waits a new random time before it
// competes again, so two proposers do not keep pre-empting each other;
// but a leader that hears a majority runs phase 1 again on a Nack (see
// onNack).
//
// The vote before a campaign (Raft's pre-vote with its leader stickiness,
// as etcd-io/raft does them) keeps a node that rejoins (restarted, or back
// from a partition) from deposing a leader the others still hear: its
// timer fires before the leader's first heartbeat reaches it, and a
// Prepare with a higher ballot would be promised and end the leader's
// ballot. So the timer starts a round instead: PrePrepare{Slot: commit+1,
// Commit, Seq: the round} to the members, each answering PrePromise{Seq}
// unless it hears a leader other than the asker (it leads with writes
// that progress, or it handled
// a message of its leader within T, counted in its own ticks so that a
// member whose loop was held up does not take that for the leader's
// silence: see leaseTicks), else Nack{Ballot: its promise, Commit, Seq},
// from which a node behind catches up. The node campaigns once a majority
// of the configuration, itself included, granted a round, and it has
// caught up to the commits the grants carried. A round writes
// nothing and raises no ballot, so refused rounds cost the group nothing;
// the round goes again each tick to the members that have not granted it
// (a leader that really failed is replaced as soon as a majority's leases
// run out), and a new one starts when the timer fires again. A leader's
// heartbeat ends it. A campaign begun by hand (campaignNow) skips it.
//
// Three rules keep a node that cannot hear the group (a one-way failure)
// from holding it still. A leader that has heard from no majority for two
// election timeouts steps down: its heartbeats would otherwise keep the
// others from ever electing a leader that can commit. A Prepare never
// restarts an election timer (only a live leader's heartbeat or Accept
// does), so a candidate that cannot win does not hold the others back.
// And a campaign not won within an election timeout is given up for a
// new vote, never followed by a higher ballot directly: a candidate that
// hears nothing would otherwise climb above every ballot and depose each
// leader the others elect.

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
	// rerun is set when a leader runs phase 1 again (onNack): it still
	// refuses the votes before a campaign, as the leader it was.
	rerun bool
}

// preVote is a round of the vote before a campaign: the members that
// granted it, this node included.
type preVote struct {
	seq     uint64
	granted map[NodeID]bool
	// behindTo is the highest commit a grant carried past ours: the
	// campaign waits until this node has caught up to it.
	behindTo uint64
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
	n.lead, n.pre = nil, nil
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

// electionTimeout runs when the election timer fires: a new round of the
// vote before a campaign. A campaign still under way (nobody answered it,
// or too few did) is given up first: the node goes back to follower and
// keeps its promise. Repeating its Prepare instead would skip the vote,
// and a candidate ignores the heartbeats of a leader below its ballot,
// so a node cut off after its promise to itself would neither follow the
// leader the others elected meanwhile nor ask them first.
func (n *Node) electionTimeout(now time.Time) error {
	if c := n.cand; c != nil {
		n.log.Debug("campaign not won within an election timeout: asking for a vote again",
			"ballot", c.ballot, "answered", c.heard)
		n.role, n.cand = roleFollower, nil
	}
	return n.preCampaign(now)
}

// preCampaign starts a round of the vote before a campaign. The election
// timer restarts: a round not granted by the time it fires again is
// followed by a new one.
func (n *Node) preCampaign(now time.Time) error {
	n.resetElection(now)
	n.preSeq++
	n.pre = &preVote{seq: n.preSeq, granted: map[NodeID]bool{n.cfg.ID: true}}
	n.log.Debug("asking for a vote before campaigning", "round", n.preSeq, "commit", n.commit)
	n.repeatPrePrepares()
	return n.tryPreVote(now) // a group of one grants it at once
}

// repeatPrePrepares sends the round's PrePrepare to the members that have
// not granted it (it may have been lost, or refused while their lease of
// a leader ran).
// It carries the promise, so that no peer reads it as "no state" (see
// ProbeGroup).
func (n *Node) repeatPrePrepares() {
	for _, p := range n.conf.peers {
		if !n.pre.granted[p.ID] {
			n.send(Message{Type: MsgPrePrepare, To: p.ID, Ballot: n.promised, Slot: n.commit + 1, Commit: n.commit, Seq: n.pre.seq})
		}
	}
}

// onPrePromise counts a member's grant of the current round. A grant
// from a member whose commit is past ours holds the campaign until this
// node has caught up to it: the entries it lacks may change the
// configuration whose majority must grant the round.
func (n *Node) onPrePromise(m Message, now time.Time) error {
	if n.pre == nil || m.Seq != n.pre.seq || !n.conf.has(m.From) {
		return nil // a late or duplicated grant
	}
	n.pre.granted[m.From] = true
	if m.Commit > n.commit {
		n.pre.behindTo = max(n.pre.behindTo, m.Commit)
		n.requestCatchUp(m.From, now)
	}
	return n.tryPreVote(now)
}

// tryPreVote campaigns once a majority of the configuration granted the
// round, and this node has caught up to the commits the grants carried
// (the configuration is then the one they chose). A removed node, or one
// no longer a member, ends the round.
func (n *Node) tryPreVote(now time.Time) error {
	pre := n.pre
	switch {
	case pre == nil:
		return nil
	case n.role != roleFollower || !n.conf.has(n.cfg.ID):
		n.pre = nil
		return nil
	case n.commit < pre.behindTo:
		return nil // onCatchUpReply or the next tick comes back here
	case !n.conf.majority(func(id NodeID) bool { return pre.granted[id] }):
		return nil
	}
	n.pre = nil
	n.health.elections++
	n.log.Info("a majority hears no leader: campaigning", "round", pre.seq)
	return n.campaign(now)
}

// leaseTicks is how many of its own ticks a follower counts a leader it
// heard as live: T, rounded up to whole heartbeats (etcd-io/raft counts
// its election timeout in ticks the same way).
func (n *Node) leaseTicks() uint64 {
	return uint64((n.cfg.ElectionTimeout + n.cfg.Heartbeat - 1) / n.cfg.Heartbeat)
}

// hearsLeader reports whether this node hears a leader other than from,
// and so refuses from's vote before a campaign: it leads and its own
// writes are not stuck (a leader that hears no majority steps down, see
// quorumLost; one whose disk has been stuck for T commits nothing of its
// own and lets the others ask) or runs phase 1 again as a leader, or it
// handled a message of its leader within the last leaseTicks ticks (a
// Prepare of that leader running phase 1 again keeps it the leader).
func (n *Node) hearsLeader(from NodeID, now time.Time) bool {
	switch {
	case n.role == roleLeader || (n.cand != nil && n.cand.rerun):
		return !n.writesStuck(now, n.cfg.ElectionTimeout)
	case n.role != roleFollower || !n.hasLeader || n.leader == from:
		return false
	}
	return n.leaderTicks < n.leaseTicks()
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

// onNack: a higher ballot exists. A proposer below it steps down, but
// for a leader that heard from a majority of its configuration within T:
// that one runs phase 1 again at once with a ballot above it (the Nack
// most likely comes from one member whose promise went past the ballot,
// say a node that promised itself a campaign and was cut off before any
// other answered, and which will otherwise refuse every Accept). A Nack
// from a node ahead of us also tells us to catch up.
func (n *Node) onNack(m Message, now time.Time) error {
	if m.Commit > n.commit && n.role != roleLeader {
		n.requestCatchUp(m.From, now)
	}
	if !n.conf.has(m.From) {
		return nil
	}
	if (n.role != roleLeader && n.role != roleCandidate) || !n.proposerBallot().Less(m.Ballot) {
		return nil
	}
	if n.role == roleLeader && n.heardMajority(now, n.cfg.ElectionTimeout) {
		n.log.Info("a member promised a higher ballot: running phase 1 again", "ballot", n.lead.ballot,
			"by", m.Ballot, "from", m.From)
		n.maxRound = max(n.maxRound, m.Ballot.Round)
		if err := n.campaign(now); err != nil {
			return err
		}
		if n.cand != nil {
			n.cand.rerun = true
		}
		return nil
	}
	n.log.Debug("pre-empted", "ballot", n.proposerBallot(), "by", m.Ballot)
	n.stepDown(now)
	return nil
}

// stepDown makes a leader or candidate a follower that waits a random
// [T, 2T) before it campaigns again. Commands it was proposing stay with
// their waiters, which re-send them (same ID) to the next leader.
func (n *Node) stepDown(now time.Time) {
	if n.role == roleLeader {
		n.log.Info("stepping down", "ballot", n.lead.ballot)
	}
	n.role = roleFollower
	n.lead, n.cand, n.pre = nil, nil, nil
	n.hasLeader = false
	n.resetElection(now)
}

// campaignNow asks the run loop to campaign at once, without the vote
// before a campaign. It does not wait.
func (n *Node) campaignNow() {
	select {
	case n.kickc <- struct{}{}:
	default:
	}
}
