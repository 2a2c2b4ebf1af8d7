package paxos

import (
	"context"
	"log/slog"
	"time"
)

// A node's election timer says "no word from the leader for a while". That
// is evidence against the leader only if this node's own loop was free to
// hear it: a round of the loop stuck on a slow fsync, or the whole process
// descheduled, looks the same from inside. The loop therefore measures its
// own stalls, and a follower whose timer fires
//   - first reads the messages that waited meanwhile (the leader's
//     heartbeats may be among them: the loop's select picks the tick or a
//     waiting message at random), and
//   - restarts its timer instead of campaigning when its own ticks were
//     held up for more than half an election timeout (as the leader's
//     quorum check already does, leader.go).
//
// What it measured is in NodeStatus and in the warning a campaign logs, so
// that an election in production says whether this node or the leader
// stalled.

// stallWindow is how far back "recent" reaches for the longest round and
// fsync that a campaign's warning reports.
const stallWindow = 5 * time.Second

// loopHealth is what the run loop measures of itself. Owned by the loop.
type loopHealth struct {
	lastLeader time.Time // a message of the leader was last handled
	lastTick   time.Time
	began      time.Time     // the current round
	input      string        // what began it
	inRound    time.Duration // how long it waited for writes so far
	// The longest round and fsync in the current window, and in the one
	// before it; since start: the longest round, the rounds over half an
	// election timeout, the campaigns started by the timer and the timer
	// restarts for a stall of this node.
	windowFrom                 time.Time
	round, prevRound           time.Duration
	sync, prevSync             time.Duration
	longest                    time.Duration
	stalls, elections, forgave uint64
}

// roundBegan records that the loop took an input (what says which) at now.
func (h *loopHealth) roundBegan(now time.Time, what string) {
	h.began, h.input, h.inRound = now, what, 0
}

// roundEnded records the round that began at h.began, and returns how
// long it took; a round longer than limit counts as a stall.
func (h *loopHealth) roundEnded(now time.Time, limit time.Duration) time.Duration {
	d := now.Sub(h.began)
	h.roll(now)
	h.round = max(h.round, d)
	h.longest = max(h.longest, d)
	if d > limit {
		h.stalls++
	}
	return d
}

// roundEnded ends the loop's round; one that held the loop up for more
// than half an election timeout is logged with what began it and how much
// of it was fsync.
func (n *Node) roundEnded() {
	limit := n.cfg.ElectionTimeout / 2
	if d := n.health.roundEnded(time.Now(), limit); d > limit {
		n.log.Warn("the run loop was held up", "round", d, "input", n.health.input,
			"waiting_for_writes", n.health.inRound, "role", n.role.String())
	}
}

// synced records one fsync'd write of the acceptor's state that took d
// (on the writer: the loop did not wait for it but in waited).
func (h *loopHealth) synced(now time.Time, d time.Duration) {
	h.roll(now)
	h.sync = max(h.sync, d)
}

// waited records that the round, begun at since, waited for every write
// to be durable (a promise, a snapshot's install).
func (h *loopHealth) waited(since time.Time) {
	h.inRound += time.Since(since)
}

// roll starts a new window when the current one is over.
func (h *loopHealth) roll(now time.Time) {
	if now.Sub(h.windowFrom) < stallWindow {
		return
	}
	h.windowFrom = now
	h.prevRound, h.round = h.round, 0
	h.prevSync, h.sync = h.sync, 0
}

// recent returns the longest round and fsync of the last 5 to 10 s.
func (h *loopHealth) recent() (round, sync time.Duration) {
	return max(h.round, h.prevRound), max(h.sync, h.prevSync)
}

// tickGap records a tick at now and returns how long since the last one
// (of any role: a leader that steps down has ticked all along, and a
// leader's quorum grace uses it too).
func (h *loopHealth) tickGap(now time.Time) time.Duration {
	gap := now.Sub(h.lastTick)
	if h.lastTick.IsZero() {
		gap = 0
	}
	h.lastTick = now
	return gap
}

// followerTick is a follower's or candidate's tick: its election timer,
// judged after the messages that waited and with this node's own stalls
// forgiven (see above), else the candidate's repeated Prepares and the
// repeated round of a vote before a campaign.
func (n *Node) followerTick(now time.Time, gap time.Duration) error {
	// Half an election timeout, and never under two heartbeats: ticks
	// come a heartbeat apart, and a timeout near it must not make every
	// gap a stall (no node would ever campaign).
	if gap > max(n.cfg.ElectionTimeout/2, 2*n.cfg.Heartbeat) {
		// This loop was held up itself: the silence says nothing of the
		// leader. The timer starts again from now.
		n.health.forgave++
		n.resetElection(now)
		n.log.Info("election timer restarted: this node's loop was held up", "gap", gap)
	}
	if !n.conf.has(n.cfg.ID) || now.Before(n.electAt) {
		if n.cand != nil {
			n.repeatPrepares()
		}
		if n.pre != nil && n.conf.has(n.cfg.ID) {
			n.repeatPrePrepares()
		}
		// A granted round held for a catch-up that has ended campaigns
		// now; a removed node's round ends.
		return n.tryPreVote(now)
	}
	waiting := len(n.tr.Recv())
	if err := n.drain(n.tr.Recv()); err != nil {
		return err
	}
	now = time.Now()
	switch {
	case now.Before(n.electAt):
		return nil // a message that waited was the leader's
	case n.role != roleFollower && n.role != roleCandidate, !n.conf.has(n.cfg.ID):
		return nil // a promise that waited made it leader, or it was removed
	}
	if n.cand == nil && n.pre == nil {
		round, sync := n.health.recent()
		level := slog.LevelWarn // a leader lost
		if n.health.lastLeader.IsZero() {
			level = slog.LevelInfo // the first election this node sees
		}
		n.log.Log(context.Background(), level, "election timer fired: asking the members for a vote before campaigning",
			"since_leader", sinceOrNever(now, n.health.lastLeader), "had_leader", n.hasLeader,
			"waiting_messages", waiting, "longest_round_recently", round, "longest_fsync_recently", sync)
	}
	return n.electionTimeout(now)
}

// sinceOrNever is now-t, or -1 when t is zero (never).
func sinceOrNever(now, t time.Time) time.Duration {
	if t.IsZero() {
		return -1
	}
	return now.Sub(t)
}
