package paxos

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Membership changes go through the log, one at a time (alpha = 1):
//
//   - A change is an OpAddNode or OpRemoveNode command. It takes effect
//     for the slots after its own: the slot that holds it is chosen by the
//     configuration before it, every later slot by the configuration
//     after it. Its effect is a pure function of the configuration and
//     the command (adding a member or removing a non-member changes
//     nothing and answers CodeRejected), so every node, and a new leader
//     reading it out of promises, computes the same configuration for
//     every slot.
//   - Only a leader that has already chosen an entry in its own ballot
//     proposes a change, and after proposing one it proposes no further
//     slot until the change is chosen and applied. So at most one change
//     is ever undecided, and consecutive configurations differ by one
//     node: any majority of one intersects any majority of the next.
//   - Quorums are majorities of the configuration in effect for the slot.
//     A candidate counts promises against its applied configuration and,
//     when the undecided slots it recovers hold changes, against each
//     configuration they lead to as well.
//   - A removed node stops voting (it ignores Prepare and Accept), stops
//     campaigning, reports Role "removed" and answers Propose with
//     ErrRemoved; acceptors promise nothing to non-members. A removed node
//     that has not applied its removal yet (it was not the leader, and the
//     members stopped sending to it) campaigns: each member answers its
//     Prepare with a Nack carrying the commit, it catches up from that
//     member and applies its own removal. Transports keep reaching a node
//     that left the configuration for this (the direct transport keeps
//     its last address). It still learns the chosen log when a leader
//     heartbeats it, so a node added back votes again once it has applied
//     the addition. An added node is
//     caught up by log or snapshot and votes once its own log has applied
//     the change.
//   - A change applies once: a repeat of its command ID (a retry, a
//     redelivered forward) gets the first result and changes nothing.

// config is one configuration of the group: its members sorted by id.
// A config is never modified; a change makes a new one.
type config struct {
	peers []Peer
}

// newConfig returns the configuration of ps (copied, sorted, the last of
// duplicate ids kept).
func newConfig(ps []Peer) *config {
	out := make([]Peer, 0, len(ps))
	for _, p := range ps {
		if i := slices.IndexFunc(out, func(q Peer) bool { return q.ID == p.ID }); i >= 0 {
			out[i] = p
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Peer) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return &config{peers: out}
}

// has reports whether id is a member.
func (c *config) has(id NodeID) bool {
	return slices.ContainsFunc(c.peers, func(p Peer) bool { return p.ID == id })
}

// addr is the member's address ("" if unknown).
func (c *config) addr(id NodeID) string {
	for _, p := range c.peers {
		if p.ID == id {
			return p.Addr
		}
	}
	return ""
}

// quorum is the size of a majority.
func (c *config) quorum() int { return len(c.peers)/2 + 1 }

// peerList returns a copy of the members.
func (c *config) peerList() []Peer { return slices.Clone(c.peers) }

// majority reports whether the ids voted for by vote include a majority
// of the configuration.
func (c *config) majority(vote func(NodeID) bool) bool {
	k := 0
	for _, p := range c.peers {
		if vote(p.ID) {
			k++
		}
	}
	return k >= c.quorum()
}

// isChange reports whether cmd changes the membership.
func isChange(cmd Command) bool { return cmd.Op == OpAddNode || cmd.Op == OpRemoveNode }

// apply returns the configuration after cmd and, when cmd changes
// nothing, why. It is deterministic: it depends on c and cmd only.
func (c *config) apply(cmd Command) (*config, string) {
	switch cmd.Op {
	case OpAddNode:
		if c.has(cmd.Node) {
			return c, fmt.Sprintf("node %d is already a member", cmd.Node)
		}
		return newConfig(append(c.peerList(), Peer{ID: cmd.Node, Addr: cmd.Addr})), ""
	case OpRemoveNode:
		if !c.has(cmd.Node) {
			return c, fmt.Sprintf("node %d is not a member", cmd.Node)
		}
		if len(c.peers) == 1 {
			return c, fmt.Sprintf("node %d is the last member", cmd.Node)
		}
		ps := slices.DeleteFunc(c.peerList(), func(p Peer) bool { return p.ID == cmd.Node })
		return newConfig(ps), ""
	}
	return c, ""
}

// changeResult answers a chosen membership change at slot and returns the
// configuration it leads to (nil when it changes nothing).
func (n *Node) changeResult(slot uint64, cmd Command) (Result, *config) {
	next, why := n.conf.apply(cmd)
	if why != "" {
		return Result{Code: CodeRejected, Err: why, Index: slot}, nil
	}
	n.log.Info("membership changed", "op", cmd.Op, "member", cmd.Node, "slot", slot)
	return Result{Code: CodeOK, Index: slot}, next
}

// setConfig installs a configuration (applied from the log or from a
// snapshot) and updates the role it implies.
func (n *Node) setConfig(c *config) {
	n.conf = c
	n.tr.SetPeers(c.peerList())
	if n.hasLeader && !c.has(n.leader) {
		// The leader was removed and has stopped leading: campaign soon,
		// still at a random time so the members do not collide.
		n.hasLeader = false
		n.electAt = time.Now().Add(n.randBetween(n.cfg.ElectionTimeout / 4))
	}
	self := n.cfg.ID
	if c.has(self) {
		n.everMember = true
		if n.role == roleRemoved {
			n.role = roleFollower
		}
		return
	}
	if n.lead != nil {
		for id := range n.lead.match {
			if !c.has(id) {
				delete(n.lead.match, id)
				delete(n.lead.seen, id)
			}
		}
	}
	if n.everMember && n.role != roleRemoved {
		n.becomeRemoved()
	}
}

// becomeRemoved makes the node a non-voting bystander: its Propose
// callers get ErrRemoved. A leader first tells the others its commit, so
// they learn the removal was chosen.
func (n *Node) becomeRemoved() {
	if n.role == roleLeader {
		n.broadcastCommit(n.lead.ballot)
	}
	n.log.Info("this node was removed from the group")
	n.role = roleRemoved
	n.lead, n.cand, n.pre = nil, nil, nil
	n.hasLeader = false
	n.failWaits(ErrRemoved)
}

// AddNode adds p to the group through the log and returns once this node
// has applied the change. Changes are made one at a time: a second one
// waits until the first is applied. Start p with Peers listing the
// current members, without itself; it is caught up and starts voting once
// its own log has applied the change.
func (n *Node) AddNode(ctx context.Context, p Peer) error {
	res, err := n.Propose(ctx, Command{Op: OpAddNode, Node: p.ID, Addr: p.Addr})
	if err != nil {
		return fmt.Errorf("paxos: add node %d: %w", p.ID, err)
	}
	if res.Code != CodeOK {
		return fmt.Errorf("paxos: add node %d: %s: %s", p.ID, res.Code, res.Err)
	}
	return nil
}

// RemoveNode removes member id from the group through the log and returns
// once this node has applied the change. The removed node stops voting;
// removing the leader makes the others elect a new one.
func (n *Node) RemoveNode(ctx context.Context, id NodeID) error {
	res, err := n.Propose(ctx, Command{Op: OpRemoveNode, Node: id})
	if err != nil {
		return fmt.Errorf("paxos: remove node %d: %w", id, err)
	}
	if res.Code != CodeOK {
		return fmt.Errorf("paxos: remove node %d: %s: %s", id, res.Code, res.Err)
	}
	return nil
}
