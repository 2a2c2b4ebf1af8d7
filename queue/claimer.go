package queue

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// claimer picks the segments and tasks of one queue to claim, and claims
// them, under one lease for one worker: a Worker's claim loops share one,
// and each external claim (Client.Claim) has one, with what the claims
// before it left (external.go). It owns the claim scheduling state: which
// segment each claim loop took from last and what that claim left of it,
// the open segments the last list found, the segments and priority levels
// seen busy, the tasks and segments whose claims were lost, the tasks a
// task runner holds, and the turns that keep lower levels from starving.
type claimer struct {
	cli    *clientv3.Client
	keys   keyspace.Space
	client *Client
	queue  string
	lease  *lease.Lease
	worker string
	runID  string // names the runs: unique, where worker ids may not be
	logger *slog.Logger

	claimed     atomic.Int64 // tasks claimed (the Worker's stats)
	shardCursor atomic.Int64
	claimSeq    atomic.Int64
	turnSeq     atomic.Int64 // claims that took something: the priority turns count these
	runSeq      atomic.Int64
	fifo        atomic.Bool // the queue was FIFO at the last claim
	fifoMu      sync.Mutex  // taken by claims of a FIFO queue

	levelMu    sync.Mutex
	busyLevels map[string]time.Time   // priority levels whose tasks all run, until when (levelMu)
	lost       *orphanList            // tasks whose claim vanished: claimed first
	runnerHeld map[string]time.Time   // tasks a task runner holds, skipped until when (levelMu)
	busySegs   map[string]time.Time   // segments whose slots all run, skipped until when (levelMu)
	turns      levelTurns             // the anti-starvation turns of segments' levels (levelMu)
	window     openWindow             // bounds the read of the open segments (levelMu)
	lostSegs   *orphanList            // segments a dead worker's run left tasks in: claimed first
	hot        [claimers]string       // per claim loop, the segment it took from last, with slots left (levelMu)
	predicted  [claimers]*segState    // per claim loop, hot's state as its last claim left it (levelMu)
	lastListed []string               // the open segments the last list read found, in order (levelMu)
	guessed    [claimers]bool         // per claim loop, hot is the next of the last list, not yet confirmed (levelMu)
	laneClaims [claimers]atomic.Int64 // per claim loop, its claims: one in readEvery reads first
	spread     uint64                 // an external claim's turn: where in the open segments it starts (0: at random among the first)
	pickN      int                    // the most segments pickSegments returns (0: 8)
}

// newClaimer is a claimer of queue q of client's namespace, claiming
// under l (set later, before the first claim, when nil) as worker.
func newClaimer(client *Client, q string, l *lease.Lease, worker string, logger *slog.Logger) *claimer {
	return &claimer{cli: client.cli, keys: client.keys, client: client, queue: q, lease: l, worker: worker, runID: NewID()[:12], logger: logger,
		busyLevels: map[string]time.Time{}, lost: newOrphanList(), runnerHeld: map[string]time.Time{},
		busySegs: map[string]time.Time{}, lostSegs: newOrphanList()}
}
