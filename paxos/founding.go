package paxos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Starting as a founding member on a new data dir. Paxos is safe only if
// an acceptor never forgets a promise or an accepted value. A member whose
// data dir was wiped, started again with itself in Peers, would come back
// with neither and vote as if it had promised nothing: a value the group
// chose with its help could be overwritten. Nothing in the new data dir
// tells that member from a founder starting for the first time, but the
// group can: before such a node runs, ProbeGroup asks the other members
// whether the group already has state (a commit or a promise), and a node
// that finds some must not found the group. It is removed and joins
// again (drover paxos members remove, then serve --join and members add).

// ErrGroupHasState matches (with errors.Is) ProbeGroup's refusal: the
// group already has state, so a node on a new data dir must join it, not
// found it.
var ErrGroupHasState = errors.New("paxos: the group already has state")

// DefaultProbeWait bounds how long ProbeGroup waits for the peers.
const DefaultProbeWait = 5 * time.Second

// probeResend is how often ProbeGroup asks the peers that have not
// answered.
const probeResend = 200 * time.Millisecond

// ProbeConfig configures ProbeGroup.
type ProbeConfig struct {
	// ID, Group and Peers are the node's, as in Config; Peers lists
	// this node too.
	ID    NodeID
	Group string
	Peers []Peer
	// Transport is the node's, not started yet: ProbeGroup reads its Recv
	// until it returns (the direct transport's Handler must already be
	// served, for the answers to arrive).
	Transport Transport
	// Wait bounds the probe. Default DefaultProbeWait.
	Wait time.Duration
	// Logger receives the outcome. Default: discard.
	Logger *slog.Logger
}

// PeerState is what a peer told ProbeGroup.
type PeerState struct {
	ID     NodeID `json:"id"`
	Commit uint64 `json:"commit"`
	Ballot Ballot `json:"ballot"`
}

// ProbeReport is what ProbeGroup learned.
type ProbeReport struct {
	// Answered are the peers that answered, with their state.
	Answered []PeerState
	// Needed is how many peers must answer, all without state, to be sure
	// the group has none: once a majority has promised anything, the
	// other members are at most len(Peers) - majority.
	Needed int
}

// HasState returns the peers that have a commit or a promise.
func (r ProbeReport) HasState() []PeerState {
	var out []PeerState
	for _, p := range r.Answered {
		if p.Commit > 0 || !p.Ballot.IsZero() {
			out = append(out, p)
		}
	}
	return out
}

// ProbeGroup asks the other peers, over the node's transport and before
// the node starts, whether the group already has state: it sends each a
// catch-up request past any log (answered with the peer's commit and
// promise and nothing else). Only that reply, or the same request from a
// peer probing too (a founder on a new data dir), can say a peer has no
// state; any other message from a peer counts only when it shows state
// (a commit or a ballot: a heartbeat, a Prepare or an Accept carries its
// ballot, a PrePrepare the sender's promise), since one that shows none
// need not mean none (a message queued for this node while it was down,
// say). A peer that is probing too answers that it has nothing. It returns once a peer reports
// state (with an error matching ErrGroupHasState), once enough peers
// answered without any (Needed), or when Wait or ctx ends: then the
// group is taken as new, as far as the peers that answered can tell, and
// the report says how many did.
func ProbeGroup(ctx context.Context, cfg ProbeConfig) (ProbeReport, error) {
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultProbeWait
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	others := slices.DeleteFunc(slices.Clone(cfg.Peers), func(p Peer) bool { return p.ID == cfg.ID })
	rep := ProbeReport{Needed: len(cfg.Peers) - newConfig(cfg.Peers).quorum() + 1}
	if len(others) == 0 {
		return rep, nil
	}
	cfg.Transport.SetPeers(cfg.Peers)
	ctx, cancel := context.WithTimeout(ctx, cfg.Wait)
	defer cancel()
	answered := map[NodeID]PeerState{}
	ask := time.NewTicker(probeResend)
	defer ask.Stop()
	askAll := func() {
		for _, p := range others {
			if _, ok := answered[p.ID]; !ok {
				_ = cfg.Transport.Send(Message{Type: MsgCatchUp, Group: cfg.Group, From: cfg.ID, To: p.ID, Slot: math.MaxUint64})
			}
		}
	}
	askAll()
	for {
		select {
		case <-ctx.Done():
			log.Warn("paxos: probe of the group ended before enough peers answered; taking the group as new",
				"answered", len(rep.Answered), "needed", rep.Needed)
			return rep, nil
		case <-ask.C:
			askAll()
		case m, ok := <-cfg.Transport.Recv():
			if !ok {
				return rep, errors.New("paxos: probe of the group: transport closed")
			}
			probeTake(cfg, m, answered, &rep)
		}
		if has := rep.HasState(); len(has) > 0 {
			return rep, probeRefusal(cfg.ID, has)
		}
		if len(rep.Answered) >= rep.Needed {
			return rep, nil
		}
	}
}

// probeTake records m, from a peer, and answers a peer's own probe.
func probeTake(cfg ProbeConfig, m Message, answered map[NodeID]PeerState, rep *ProbeReport) {
	if m.Group != cfg.Group || m.To != cfg.ID || m.From == cfg.ID ||
		!slices.ContainsFunc(cfg.Peers, func(p Peer) bool { return p.ID == m.From }) {
		return
	}
	if m.Type == MsgCatchUp {
		// A peer probing too (or catching up): this node has nothing.
		_ = cfg.Transport.Send(Message{Type: MsgCatchUpReply, Group: cfg.Group, From: cfg.ID, To: m.From})
	}
	st := PeerState{ID: m.From, Commit: m.Commit, Ballot: m.Ballot}
	old, seen := answered[m.From]
	probe := m.Type == MsgCatchUp && m.Slot == math.MaxUint64 // a founder's
	if st.Commit == 0 && st.Ballot.IsZero() && (seen || (m.Type != MsgCatchUpReply && !probe)) {
		return
	}
	answered[m.From] = st
	if seen {
		rep.Answered = slices.DeleteFunc(rep.Answered, func(p PeerState) bool { return p == old })
	}
	rep.Answered = append(rep.Answered, st)
}

// probeRefusal says what to do about a node on a new data dir in a group
// with state.
func probeRefusal(id NodeID, has []PeerState) error {
	var who []string
	for _, p := range has {
		who = append(who, fmt.Sprintf("node %d has commit %d and ballot %s", p.ID, p.Commit, p.Ballot))
	}
	return fmt.Errorf("%w (%s), but node %d has a new data dir: a member that lost its data dir must not vote again "+
		"as if it had promised nothing. Remove it from the group (drover paxos members remove --id %d), then start it "+
		"with --join and the current members in --peers, and add it (drover paxos members add --id %d --addr HOST:PORT)",
		ErrGroupHasState, strings.Join(who, "; "), id, id, id)
}

// DataDirIsNew reports whether dir holds no node state yet (neither
// paxos.db nor an acceptor log): NewNode would start there with no promise
// and no accepted value.
func DataDirIsNew(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(dir, storFile))
	switch {
	case err == nil:
		return false, nil
	case !errors.Is(err, os.ErrNotExist):
		return false, fmt.Errorf("paxos: data dir %s: %w", dir, err)
	}
	gens, _, err := walGenerations(dir)
	if errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("paxos: data dir %s: %w", dir, err)
	}
	return len(gens) == 0, nil
}
