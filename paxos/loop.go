package paxos

import (
	"context"
	"fmt"
	"time"
)

// The run loop: the one goroutine that owns a node's consensus state.

// run is the loop that owns the consensus state (hashicorp/raft's run
// loop is the model): it takes one input, drains whatever else is ready,
// then hands what was accepted to the writer (writer.go); the replies that
// depend on it go when the writer says it is durable.
func (n *Node) run(ctx context.Context) {
	n.wr = newWriter(n.store)
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
		case <-n.wr.notify:
			n.health.roundBegan(time.Now(), "durable")
			err = n.onDurable()
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
	if n.stopErr == nil {
		// The writes in flight end first: releasing them may apply
		// entries, and so start a snapshot.
		if err := n.sync(); err != nil {
			n.stopErr = err
		} else if n.commit > n.savedCommit {
			_ = n.store.SetCommit(n.commit)
		}
	}
	n.wr.close()
	n.snapWG.Wait() // a snapshot being saved ends before the storage closes
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
		return n.onNack(m, now)
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
	case MsgPrePrepare:
		n.onPrePrepare(m, now)
	case MsgPrePromise:
		return n.onPrePromise(m, now)
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
	n.leaderTicks++
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
		n.submit(writeJob{commit: commit})
	}
	return nil
}

// flush ends a round: the leader places pending commands in slots, then
// what was accepted goes to the writer, and the replies that report it
// wait for the write (persist).
func (n *Node) flush(now time.Time) error {
	if n.role == roleLeader {
		n.proposeBatches(now)
	}
	n.sendForwards()
	n.persist()
	if n.role == roleLeader {
		n.announceCommit()
	}
	return nil
}

// heldReplies are the replies of a round and, on a leader, the entries
// it accepted, waiting until the writes up to seq are durable.
type heldReplies struct {
	seq     uint64
	out     []Message
	entries []Entry
}

// persist hands the round's accepted entries and raised promise to the
// writer, and holds the round's replies until every write submitted so
// far is durable: a reply may report an entry that an earlier round's
// write, still running, holds (a duplicated Accept).
func (n *Node) persist() {
	es := n.unsynced
	if len(es) > 0 || n.promiseDirt {
		n.submit(writeJob{promised: n.promised, entries: es, write: true, commit: n.commit})
	}
	if len(n.outbox) > 0 || (len(es) > 0 && n.role == roleLeader) {
		h := heldReplies{seq: n.lastSeq, out: n.outbox}
		if n.role == roleLeader {
			h.entries = es // its own acceptance counts once they are durable
		}
		n.held = append(n.held, h)
	}
	n.unsynced, n.promiseDirt, n.outbox = nil, false, nil
	n.release()
}

// submit gives j the next sequence number and queues it on the writer. A
// job carries the commit as of its round: every entry at or below it is
// in this job or an earlier one.
func (n *Node) submit(j writeJob) {
	if n.durableSeq == n.lastSeq {
		n.writeWait = time.Now() // the first write pending
	}
	n.lastSeq++
	j.seq = n.lastSeq
	n.wr.submit(j)
	n.savedCommit = max(n.savedCommit, j.commit)
}

// release sends the held replies whose writes are durable, and counts the
// leader's own acceptance of the entries in them.
func (n *Node) release() {
	for len(n.held) > 0 && n.held[0].seq <= n.durableSeq {
		h := n.held[0]
		n.held[0] = heldReplies{}
		n.held = n.held[1:]
		for _, m := range h.out {
			n.send(m)
		}
		if n.role == roleLeader {
			n.ackOwn(h.entries)
		}
	}
}

// onDurable takes the writer's report: it releases what became durable,
// or returns the write's error (the loop halts).
func (n *Node) onDurable() error {
	durable, took, err := n.wr.report()
	if took > 0 {
		n.health.synced(time.Now(), took)
	}
	if err != nil {
		return err
	}
	if durable > n.durableSeq {
		n.writeWait = time.Now() // progress: the rest wait from now
	}
	n.durableSeq = durable
	n.release()
	return nil
}

// writesStuck reports whether writes are pending and none became durable
// for d: this node's disk has stalled.
func (n *Node) writesStuck(now time.Time, d time.Duration) bool {
	return n.durableSeq < n.lastSeq && now.Sub(n.writeWait) >= d
}

// sync persists what was accepted and waits until every write submitted
// is durable, sending the replies that waited. Phase 1, a campaign, a
// snapshot's install and shutdown write the storage directly after it.
func (n *Node) sync() error {
	n.persist()
	if n.durableSeq < n.lastSeq {
		defer n.health.waited(time.Now())
	}
	for n.durableSeq < n.lastSeq {
		select {
		case <-n.wr.notify:
		case <-n.wr.done:
		}
		if err := n.onDurable(); err != nil {
			return err
		}
		if n.durableSeq < n.lastSeq && n.wr.ended() {
			return errWriterEnded
		}
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
