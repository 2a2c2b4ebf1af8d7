package paxos

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/paxos/client"
)

// Errors a caller of Propose, AddNode or RemoveNode branches on.
var (
	// ErrTimeout: the context ended before the command was applied on
	// this node (no leader, no quorum, or just slow). The command may still
	// be applied later; retrying with the same Command.ID is safe. It is
	// client.ErrTimeout, which the API's 504 answers match too.
	ErrTimeout = client.ErrTimeout
	// ErrStopped: the node is stopped (or stopping): send the request to
	// another node.
	ErrStopped = errors.New("paxos: node stopped")
	// ErrRemoved: this node was removed from the group and no longer takes
	// part in it: send the request to another node.
	ErrRemoved = errors.New("paxos: node removed from the group")
)

// Defaults for the zero values of Config.
const (
	// DefaultGroup is the group name when Config.Group is empty.
	DefaultGroup = "drover"
	// DefaultHeartbeat is the leader's heartbeat period.
	DefaultHeartbeat = 50 * time.Millisecond
	// DefaultElectionTimeout is T: followers campaign after [T, 2T) of
	// silence.
	DefaultElectionTimeout = 500 * time.Millisecond
	// DefaultSnapshotEvery is how many applied entries trigger a snapshot.
	DefaultSnapshotEvery = 10000
	// DefaultMaxBatch caps the commands of one Accept.
	DefaultMaxBatch = 512
)

// Config configures a Node. Zero values mean the defaults.
type Config struct {
	// ID is this node's id in the group.
	ID NodeID
	// Group names the group; a data dir of another group is refused.
	// Default DefaultGroup.
	Group string
	// Peers are the initial members, used when the data dir is new (a
	// restarted node reads its members from its data dir). Founding
	// members list every member, themselves included. A node that joins
	// a running group lists the current members without itself and waits,
	// without voting or campaigning, until an AddNode for it is applied.
	Peers []Peer
	// Transport carries messages to the other members. The node does not
	// close it.
	Transport Transport
	// DataDir holds the durable acceptor state (DataDir/acceptor-*.log)
	// and the identity and latest snapshot (DataDir/paxos.db).
	DataDir string
	// Heartbeat is the leader's heartbeat period, and the node's tick.
	// Default DefaultHeartbeat.
	Heartbeat time.Duration
	// ElectionTimeout T: a follower that hears no leader for a random time
	// in [T, 2T) campaigns. Must be above Heartbeat. Default
	// DefaultElectionTimeout.
	ElectionTimeout time.Duration
	// LockDelay blocks re-granting an expired lock for this long (see
	// NewTable). Default 0.
	LockDelay time.Duration
	// SnapshotEvery is how many applied entries above the last snapshot
	// trigger the next, which truncates the log; more when the table is
	// large (a quarter of the last snapshot's items: locks and remembered
	// results), so that encoding stays cheap per entry. Default
	// DefaultSnapshotEvery.
	SnapshotEvery uint64
	// MaxBatch caps the commands of one Accept. Default DefaultMaxBatch.
	MaxBatch int
	// Logger receives the node's log. Default: discard.
	Logger *slog.Logger
	// Now is the clock the leader stamps commands with. Default time.Now.
	Now func() time.Time
}

// Validate fills in the defaults of zero fields and reports the first
// field that is wrong.
func (c *Config) Validate() error {
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = DefaultElectionTimeout
	}
	if c.SnapshotEvery == 0 {
		c.SnapshotEvery = DefaultSnapshotEvery
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case c.Transport == nil:
		return errors.New("paxos: config: Transport is required")
	case c.DataDir == "":
		return errors.New("paxos: config: DataDir is required")
	case len(c.Peers) == 0:
		return errors.New("paxos: config: Peers is required (the group's members, this node included when it founds the group)")
	case c.Heartbeat < 0 || c.ElectionTimeout < 0 || c.LockDelay < 0:
		return errors.New("paxos: config: Heartbeat, ElectionTimeout and LockDelay must not be negative")
	case c.ElectionTimeout <= c.Heartbeat:
		return fmt.Errorf("paxos: config: ElectionTimeout (%s) must be above Heartbeat (%s), ideally 10 times it",
			c.ElectionTimeout, c.Heartbeat)
	case c.MaxBatch < 0:
		return fmt.Errorf("paxos: config: MaxBatch %d must be positive", c.MaxBatch)
	}
	seen := map[NodeID]bool{}
	for _, p := range c.Peers {
		if seen[p.ID] {
			return fmt.Errorf("paxos: config: peer %d listed twice", p.ID)
		}
		seen[p.ID] = true
	}
	return nil
}

// Node is one member of a group: proposer, acceptor and learner of the
// replicated lock table. One goroutine, the run loop, owns all consensus
// state; Propose, Status, AddNode and RemoveNode talk to it over
// channels, and every channel operation also watches for the loop's end.
//
// Every command, reads (OpGet, OpList) included, goes through the log and
// is answered from this node's own apply of it, so answers are
// linearizable; no leader lease is assumed.
type Node struct {
	// leaderAddr is the address of the leader as of the run loop's last
	// round (LeaderAddr).
	leaderAddr atomic.Pointer[string]
	cfg        Config
	log        *slog.Logger
	store      *Storage
	sm         StateMachine
	tr         Transport

	mu      sync.Mutex // guards started, stopped
	started bool
	stopped bool
	stopc   chan struct{} // closed by Stop
	done    chan struct{} // closed when the loop has ended and storage is closed
	// Read after done: why the loop ended (errLoopStopped for Stop), and
	// the error Stop reports (a storage failure, or closing the storage).
	exitErr error
	stopErr error

	propc   chan *request
	statusc chan chan NodeStatus
	kickc   chan struct{}
	// snapDone carries a background snapshot's outcome to the loop
	// (buffered 1, one snapshot at a time); snapWG counts that goroutine.
	snapDone chan snapSaved
	snapWG   sync.WaitGroup

	// Everything below is owned by the run loop (or by NewNode before
	// Start, and by anyone after done).
	rng        *rand.Rand
	role       role
	promised   Ballot
	maxRound   uint64
	leader     NodeID
	hasLeader  bool
	electAt    time.Time
	conf       *config
	everMember bool

	// entries are the accepted entries not yet applied (above the
	// commit); chosen keeps the applied ones down to the snapshot, and
	// the trailing ones at and below it that catch-ups may still be
	// served from (see trailing).
	entries     map[uint64]Entry
	chosen      chosenLog
	commit      uint64
	applied     uint64
	savedCommit uint64
	snap        *Snapshot
	snapping    bool      // a snapshot is being saved in the background
	snapItems   uint64    // items in the last snapshot taken
	trailFrom   uint64    // entries at or below it were cut: catch-ups from there need the snapshot
	snapsSent   uint64    // catch-up replies that carried the snapshot
	snapsIn     uint64    // snapshots installed from a peer
	unsynced    []Entry   // accepted in memory, to hand to the writer
	promiseDirt bool      // promised raised in memory by an Accept
	outbox      []Message // the round's replies that wait for its write
	// The writer (writer.go), created by run: the last job submitted, the
	// last it reported durable, since when the writes pending have made
	// no progress (writesStuck), and the replies held for writes.
	wr         *writer
	lastSeq    uint64
	durableSeq uint64
	writeWait  time.Time
	held       []heldReplies
	forwards   map[NodeID][]Command

	cand *candidate
	lead *leaderState
	// pre is the vote before a campaign under way (nil if none), preSeq
	// the last round's number; leaderTicks counts the ticks since a
	// message of the leader was last handled (hearsLeader).
	pre         *preVote
	preSeq      uint64
	leaderTicks uint64

	waits        map[string]*wait
	health       loopHealth
	failed       error // a storage failure: the loop halts at the end of the round
	catchPending bool
	catchAt      time.Time
}

// request is one Propose handed to the loop.
type request struct {
	cmd  Command
	ch   chan proposeResult // buffered: the loop never blocks on it
	done <-chan struct{}    // the caller's ctx.Done()
}

type proposeResult struct {
	res Result
	err error
}

// NewNode validates cfg, opens the data dir (refusing another group's with
// an error matching ErrWrongGroup) and recovers from the snapshot and the
// chosen log there. It may start saving a snapshot of what it recovered in
// the background (Stop waits for it); the node runs once Start is called.
func NewNode(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	store, st, err := OpenStorage(cfg.DataDir, cfg.Group, cfg.ID, cfg.Peers)
	if err != nil {
		return nil, fmt.Errorf("paxos: node %d: %w", cfg.ID, err)
	}
	n := &Node{
		cfg:      cfg,
		log:      cfg.Logger.With("node", cfg.ID),
		store:    store,
		sm:       NewTable(cfg.LockDelay),
		tr:       cfg.Transport,
		stopc:    make(chan struct{}),
		done:     make(chan struct{}),
		propc:    make(chan *request, 256),
		statusc:  make(chan chan NodeStatus),
		kickc:    make(chan struct{}, 1),
		snapDone: make(chan snapSaved, 1),
		rng:      rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(cfg.ID))),
		entries:  map[uint64]Entry{},
		waits:    map[string]*wait{},
		forwards: map[NodeID][]Command{},
	}
	if err := n.restore(st); err != nil {
		_ = store.Close()
		return nil, fmt.Errorf("paxos: node %d: recover from %s: %w", cfg.ID, cfg.DataDir, err)
	}
	return n, nil
}

// Start starts the run loop. The node runs until Stop is called or ctx is
// cancelled. Calling Start again does nothing; once the node has stopped
// (Stop, or ctx) it returns ErrStopped.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return ErrStopped
	}
	if n.started {
		select {
		case <-n.done:
			return ErrStopped
		default:
			return nil
		}
	}
	n.started = true
	n.tr.SetPeers(n.conf.peerList())
	n.resetElection(time.Now())
	go n.run(ctx)
	return nil
}

// Stop stops the node: the run loop ends (waiting Propose calls return
// ErrStopped), then the storage is closed. It does not close the
// transport. Safe to call twice and before Start.
func (n *Node) Stop() error {
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		<-n.done
		return nil
	}
	n.stopped = true
	close(n.stopc)
	started := n.started
	n.mu.Unlock()
	if !started {
		n.snapWG.Wait() // a snapshot NewNode began saving
		err := n.store.Close()
		close(n.done)
		return err
	}
	<-n.done
	return n.stopErr
}

var errLoopStopped = errors.New("stopped")

// Propose has the group choose cmd and returns its result as applied on
// this node: the node sends cmd to the leader (itself, or over the
// network), retries with the same ID while no leader answers, and waits
// until its own copy of the log applies a command with cmd.ID (Propose
// gives cmd a unique ID if it has none; the table answers a repeated ID
// with the first result). When ctx ends first the error wraps ErrTimeout
// and ctx.Err(). On a stopped node it is ErrStopped, on a removed one
// ErrRemoved.
func (n *Node) Propose(ctx context.Context, cmd Command) (Result, error) {
	if cmd.ID == "" {
		cmd.ID = n.newID()
	}
	req := &request{cmd: cmd, ch: make(chan proposeResult, 1), done: ctx.Done()}
	select {
	case n.propc <- req:
	case <-ctx.Done():
		return Result{}, proposeTimeout(ctx, cmd)
	case <-n.done:
		return Result{}, n.stoppedErr()
	}
	select {
	case r := <-req.ch:
		return r.res, r.err
	case <-ctx.Done():
		return Result{}, proposeTimeout(ctx, cmd)
	case <-n.done:
		return Result{}, n.stoppedErr()
	}
}

func proposeTimeout(ctx context.Context, cmd Command) error {
	return fmt.Errorf("paxos: %s %s (id %s): %w: %w", cmd.Op, cmd.Lock, cmd.ID, ErrTimeout, ctx.Err())
}

func (n *Node) stoppedErr() error {
	if n.exitErr != nil && !errors.Is(n.exitErr, errLoopStopped) {
		return fmt.Errorf("%w: %w", ErrStopped, n.exitErr)
	}
	return ErrStopped
}

func (n *Node) newID() string {
	var b [12]byte
	_, _ = crand.Read(b[:])
	return fmt.Sprintf("%d-%s", n.cfg.ID, hex.EncodeToString(b[:]))
}

// LeaderAddr is the address of the leader this node knows, as of its run
// loop's last round: "" when it knows none, when the leader has no address
// (over RabbitMQ) or when this node has stopped or was removed. Unlike
// Status it does not wait for the loop; the API names the leader with it
// on every answer (LeaderHeader).
func (n *Node) LeaderAddr() string {
	if p := n.leaderAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// publishLeader sets what LeaderAddr returns (run loop only).
func (n *Node) publishLeader() {
	addr := ""
	if n.hasLeader && n.role != roleRemoved {
		addr = n.conf.addr(n.leader)
	}
	if p := n.leaderAddr.Load(); p == nil || *p != addr {
		s := addr // allocated only when the leader changes
		n.leaderAddr.Store(&s)
	}
}

// Status reports the node's view of the group. It is cheap and safe to
// call at any time, before Start and after Stop included.
func (n *Node) Status() NodeStatus {
	n.mu.Lock()
	if !n.started {
		defer n.mu.Unlock()
		return n.status() // no loop yet: the state is NewNode's
	}
	n.mu.Unlock()
	ch := make(chan NodeStatus, 1)
	select {
	case n.statusc <- ch:
		return <-ch
	case <-n.done:
		return n.status()
	}
}

// status builds a NodeStatus from the loop's state.
func (n *Node) status() NodeStatus {
	s := NodeStatus{
		ID: n.cfg.ID, Role: n.role.String(), Leader: n.leader, HasLeader: n.hasLeader,
		Ballot: n.promised, Commit: n.commit, Applied: n.applied, SnapshotIndex: n.snapIndex(),
		SnapshotsSent: n.snapsSent, SnapshotsInstalled: n.snapsIn,
		ElectionsStarted: n.health.elections, TimerRestarts: n.health.forgave,
		LoopStalls: n.health.stalls, LongestRoundMS: float64(n.health.longest.Microseconds()) / 1000,
	}
	if n.hasLeader {
		s.LeaderAddr = n.conf.addr(n.leader)
	}
	for _, p := range n.conf.peers {
		ps := PeerStatus{ID: p.ID, Addr: p.Addr}
		if n.lead != nil {
			ps.Match = n.lead.match[p.ID]
			if p.ID == n.cfg.ID {
				ps.Match = n.commit
			}
			ps.LastSeen = n.lead.seen[p.ID]
			if ps.Match < n.commit {
				ps.Lag = n.commit - ps.Match
			}
		}
		s.Members = append(s.Members, ps)
	}
	return s
}

// role is what a node is doing in the group.
type role uint8

const (
	roleFollower role = iota
	roleCandidate
	roleLeader
	roleRemoved
)

func (r role) String() string {
	switch r {
	case roleCandidate:
		return "candidate"
	case roleLeader:
		return "leader"
	case roleRemoved:
		return "removed"
	default:
		return "follower"
	}
}

// randBetween returns a random duration in [d, 2d).
func (n *Node) randBetween(d time.Duration) time.Duration {
	return d + time.Duration(n.rng.Int64N(int64(d)))
}

// ErrHalted matches (with errors.Is) the Health of a node whose run loop
// halted on a storage failure: it takes no further part in the group
// until it is restarted. It matches ErrStopped as well.
var ErrHalted = errors.New("paxos: node halted")

// errNotStarted is the Health of a node before Start.
var errNotStarted = fmt.Errorf("%w: not started", ErrStopped)

// Health reports whether the node takes part in its group: nil while its
// run loop runs (as a follower, candidate, leader, or removed member); an
// error matching ErrStopped before Start and once Stop was called or the
// Start context ended; and one matching ErrHalted too when the loop
// halted because its durable state could not be written, which only a
// restart cures. Status still answers then, with the last view the loop
// had: Health is what a liveness probe needs.
func (n *Node) Health() error {
	n.mu.Lock()
	started, stopped := n.started, n.stopped
	n.mu.Unlock()
	if !started {
		if stopped {
			return ErrStopped
		}
		return errNotStarted
	}
	select {
	case <-n.done:
		// exitErr and stopErr are written before done is closed.
		if n.stopErr != nil && n.exitErr == n.stopErr {
			return fmt.Errorf("%w: %w: its durable state could not be written (%v); restart it",
				ErrStopped, ErrHalted, n.stopErr)
		}
		return n.stoppedErr()
	default:
	}
	if stopped {
		return fmt.Errorf("%w: stopping", ErrStopped)
	}
	return nil
}
