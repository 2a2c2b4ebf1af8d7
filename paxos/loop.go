package paxos

import (
	"context"
	"fmt"
	"time"
)

// The run loop: the one goroutine that owns a node's consensus state.

// run is the loop that owns the consensus state (hashicorp/raft's run
// loop is the model): it takes one input, drains whatever else is ready,
// then persists what was accepted and only then sends the replies that
// depend on it.
func (n *Node) run(ctx context.Context) {
	defer n.shutdown()
	ticker := time.NewTicker(n.cfg.Heartbeat)
	defer ticker.Stop()
	recv := n.tr.Recv()
	for {
		var err error
		select {
		case <-n.stopc:
			n.exitErr = errLoopStopped
			return
		case <-ctx.Done():
			n.exitErr = fmt.Errorf("paxos: node %d: %w", n.cfg.ID, ctx.Err())
			return
		case m, ok := <-recv:
			if !ok {
				recv = nil
				continue
			}
			n.health.roundBegan(time.Now(), m.Type.String())
			err = n.step(m)
		case req := <-n.propc:
			n.health.roundBegan(time.Now(), "proposal")
			n.onPropose(req)
		case ch := <-n.statusc:
			n.health.roundBegan(time.Now(), "status")
			ch <- n.status()
		case <-n.kickc:
			n.health.roundBegan(time.Now(), "campaign")
			err = n.campaign(time.Now())
		case r := <-n.snapDone:
			n.health.roundBegan(time.Now(), "snapshot saved")
			n.snapshotSaved(r)
		case <-ticker.C:
			n.health.roundBegan(time.Now(), "tick")
			err = n.tick(time.Now())
		}
		if err == nil {
			err = n.drain(recv)
		}
		if err == nil {
			err = n.flush(time.Now())
		}
		n.publishLeader()
		n.roundEnded()
		if err == nil {
			err = n.failed
		}
		if err != nil {
			n.log.Error("paxos node halted: durable state could not be written", "err", err)
			n.exitErr, n.stopErr = err, err
			return
		}
	}
}

// drainMax bounds the inputs taken in one round before a flush.
const drainMax = 256

// drain handles the messages and proposals that are already waiting, so
// one flush (one fsync) covers them all.
func (n *Node) drain(recv <-chan Message) error {
	for range drainMax {
		select {
		case m, ok := <-recv:
			if !ok {
				return nil
			}
			if err := n.step(m); err != nil {
				return err
			}
		case req := <-n.propc:
			n.onPropose(req)
		default:
			return nil
		}
	}
	return nil
}

// shutdown ends the loop: it records the commit index and closes the
// storage; waiting Propose calls see done closed and return ErrStopped.
func (n *Node) shutdown() {
	n.leaderAddr.Store(new(string)) // a stopped node names no leader
	n.snapWG.Wait()                 // a snapshot being saved ends before the storage closes
	if n.stopErr == nil {
		if err := n.sync(); err == nil && n.commit > n.savedCommit {
			_ = n.store.SetCommit(n.commit)
		}
	}
	if err := n.store.Close(); err != nil && n.stopErr == nil {
		n.stopErr = err
	}
	close(n.done)
}

// step handles one message from another node.
func (n *Node) step(m Message) error {
	if m.Group != n.cfg.Group || m.From == n.cfg.ID || (m.To != n.cfg.ID && m.To != 0) {
		return nil
	}
	if m.Ballot.Round > n.maxRound {
		n.maxRound = m.Ballot.Round
	}
	now := time.Now()
	switch m.Type {
	case MsgPrepare:
		return n.onPrepare(m, now)
	case MsgPromise:
		return n.onPromise(m, now)
	case MsgAccept:
		n.onAccept(m, now)
	case MsgAccepted:
		n.onAccepted(m, now)
	case MsgNack:
		n.onNack(m, now)
	case MsgHeartbeat:
		n.onHeartbeat(m, now)
	case MsgHeartbeatAck:
		n.onHeartbeatAck(m, now)
	case MsgCatchUp:
		n.onCatchUp(m)
	case MsgCatchUpReply:
		return n.onCatchUpReply(m, now)
	case MsgForward:
		n.onForward(m)
	}
	return nil
}

// tick runs every Heartbeat: the leader's heartbeats, retransmissions and
// expiry ticks; a follower's election timer; retries of waiting
// proposals.
func (n *Node) tick(now time.Time) error {
	// The commit the last round's flush covers with entries on disk: a
	// follower's tick may read messages (followerTick) that raise the
	// commit over entries not written yet.
	commit := n.commit
	gap := n.health.tickGap(now)
	switch n.role {
	case roleLeader:
		n.leaderTick(now, gap)
	case roleFollower, roleCandidate:
		if err := n.followerTick(now, gap); err != nil {
			return err
		}
	}
	n.retryWaits(now)
	if commit > n.savedCommit {
		if err := n.store.SetCommit(commit); err != nil {
			return err
		}
		n.savedCommit = commit
	}
	return nil
}

// flush ends a round: the leader places pending commands in slots, then
// the accepted entries are persisted (one fsynced transaction) and only
// then the replies that announce them are sent.
func (n *Node) flush(now time.Time) error {
	for range 4 {
		if n.role == roleLeader {
			n.proposeBatches(now)
		}
		n.sendForwards()
		before := n.commit
		if err := n.sync(); err != nil {
			return err
		}
		if n.commit == before || n.role != roleLeader {
			break
		}
	}
	if n.role == roleLeader {
		n.announceCommit()
	}
	return nil
}

// sync persists what was accepted in memory, then sends the replies
// waiting for it, then counts the leader's own acceptance.
func (n *Node) sync() error {
	if len(n.unsynced) == 0 && !n.promiseDirt && len(n.outbox) == 0 {
		return nil
	}
	es := n.unsynced
	if len(es) > 0 || n.promiseDirt {
		began := time.Now()
		if err := n.store.Accept(n.promised, es); err != nil {
			return err
		}
		n.health.synced(time.Now(), time.Since(began))
	}
	n.unsynced, n.promiseDirt = nil, false
	out := n.outbox
	n.outbox = nil
	for _, m := range out {
		n.send(m)
	}
	if n.role == roleLeader {
		n.ackOwn(es)
	}
	return nil
}

// send stamps m with the group and sender and hands it to the transport.
func (n *Node) send(m Message) {
	m.Group, m.From = n.cfg.Group, n.cfg.ID
	if err := n.tr.Send(m); err != nil {
		n.log.Debug("send failed", "type", m.Type, "to", m.To, "err", err)
	}
}
