package client

import (
	"encoding/json"
	"fmt"
	"time"
)

// Headers of the REST API.
const (
	// LeaderHeader, on every answer of a node that knows the leader and
	// its address, is the leader's host:port: a client that sends its
	// requests there saves the hops of a forward (Client does).
	LeaderHeader = "Paxos-Leader"
	// IdempotencyHeader names a request: a request sent again with the same
	// key (after a lost answer, to another node) is applied once and
	// answered with the first answer, for as long as the lock table keeps
	// its command ids (five minutes of log time). A key sent with a
	// different request (another route, lock, owner, token, ttl or
	// holder) is answered 422 and nothing is applied. drover server's
	// /locks remembers a key only in the grant an acquisition made: a
	// repeated acquisition gets that grant while it holds the lock (see
	// docs/http.md for the rest).
	IdempotencyHeader = "Idempotency-Key"
)

// NodeID names one node of a group. In a StatefulSet it is the pod's
// ordinal: lock-service-2 is node 2.
type NodeID uint64

// Ballot is a proposal number: a round, with the proposing node's id to
// break ties, so two nodes never share a ballot. The zero Ballot is below
// every real one (real rounds start at 1).
type Ballot struct {
	Round uint64 `json:"r"`
	Node  NodeID `json:"n"`
}

// Less reports whether b orders before o: by round, then by node id.
func (b Ballot) Less(o Ballot) bool {
	if b.Round != o.Round {
		return b.Round < o.Round
	}
	return b.Node < o.Node
}

// IsZero reports whether b is the zero ballot (no ballot yet).
func (b Ballot) IsZero() bool { return b.Round == 0 }

// String formats b as round.node.
func (b Ballot) String() string { return fmt.Sprintf("%d.%d", b.Round, b.Node) }

// Peer is one member of the group and the address its direct transport
// and HTTP API answer on (empty over RabbitMQ, where nodes need no
// addresses to reach each other).
type Peer struct {
	ID   NodeID `json:"id"`
	Addr string `json:"addr,omitempty"`
}

// LockInfo is a held lock as the API shows it.
type LockInfo struct {
	LockID string `json:"lockId"`
	Owner  string `json:"owner"`
	// Token is the fencing token: the log index of the grant.
	Token uint64 `json:"token"`
	// Acquired and Expires are the leader's clock in Unix milliseconds.
	Acquired int64 `json:"acquired"`
	Expires  int64 `json:"expires"`
	// TTL is the time left, in seconds, by the answering node's clock.
	TTL float64 `json:"ttl"`
	// Holder is the object the owner stored with the grant, if any.
	Holder json.RawMessage `json:"holder,omitempty"`
}

// AcquireResponse is the 200 answer of POST /locks/{id}.
type AcquireResponse struct {
	Status  string       `json:"status"`
	Details GrantDetails `json:"details"`
	Token   uint64       `json:"token"`
}

// GrantDetails describes a grant: the Express service's lockId, owner and expires,
// with acquired and the holder object added.
type GrantDetails struct {
	LockID   string          `json:"lockId"`
	Owner    string          `json:"owner"`
	Expires  int64           `json:"expires"`
	Acquired int64           `json:"acquired"`
	Holder   json.RawMessage `json:"holder,omitempty"`
}

// NodeStatus is a node's view of the group.
type NodeStatus struct {
	// ID is this node's id.
	ID NodeID `json:"id"`
	// Role is "leader", "follower", "candidate" or "removed".
	Role string `json:"role"`
	// Leader is the node this one follows (itself when leading); valid
	// when HasLeader.
	Leader    NodeID `json:"leader"`
	HasLeader bool   `json:"has_leader"`
	// LeaderAddr is the leader's address, when known.
	LeaderAddr string `json:"leader_addr,omitempty"`
	// Ballot is the highest ballot this node promised.
	Ballot Ballot `json:"ballot"`
	// Commit is the highest slot this node knows chosen; Applied the
	// highest applied (they are equal but while a snapshot installs).
	Commit        uint64 `json:"commit"`
	Applied       uint64 `json:"applied"`
	SnapshotIndex uint64 `json:"snapshot_index"`
	// SnapshotsSent counts the catch-up answers this node sent as a whole
	// snapshot (the entries asked for were truncated, or the peer joins
	// with an empty log), and SnapshotsInstalled the snapshots it
	// installed from a peer, since it started.
	SnapshotsSent      uint64 `json:"snapshots_sent"`
	SnapshotsInstalled uint64 `json:"snapshots_installed"`
	// ElectionsStarted counts the campaigns this node started because its
	// election timer fired; TimerRestarts the times it restarted the timer
	// instead, its own loop having been held up for more than half an
	// election timeout. LoopStalls counts the rounds of its loop that took
	// longer than that, LongestRoundMS is the longest in milliseconds, all
	// since it started (see stalls.go).
	ElectionsStarted uint64  `json:"elections_started"`
	TimerRestarts    uint64  `json:"timer_restarts"`
	LoopStalls       uint64  `json:"loop_stalls"`
	LongestRoundMS   float64 `json:"longest_round_ms"`
	// Members is the configuration in effect at Applied.
	Members []PeerStatus `json:"members"`
}

// PeerStatus is one member as a node sees it. Match, Lag and LastSeen are
// known on the leader only (zero elsewhere).
type PeerStatus struct {
	// ID and Addr name the member.
	ID   NodeID `json:"id"`
	Addr string `json:"addr,omitempty"`
	// Match is the highest slot the member is known to have accepted or
	// applied.
	Match uint64 `json:"match"`
	// Lag is the leader's commit minus Match.
	Lag uint64 `json:"lag"`
	// LastSeen is when the leader last heard from the member.
	LastSeen time.Time `json:"last_seen,omitzero"`
}

// The bodies of the lock routes, one encoding for every server that
// serves them (a Paxos node, and drover server under /locks) and for
// Client. Pointers in request bodies tell a field left out from a zero
// one.

// AcquireBody is the body of POST /locks/{id}.
type AcquireBody struct {
	Owner  *string          `json:"owner"`
	TTL    *float64         `json:"ttl"`
	Holder *json.RawMessage `json:"holder,omitempty"`
}

// OwnerTokenBody is the body of DELETE /locks/{id} (owner and token) and
// of POST /locks/{id}/renew (owner, token and ttl).
type OwnerTokenBody struct {
	Owner *string  `json:"owner"`
	Token *uint64  `json:"token"`
	TTL   *float64 `json:"ttl,omitempty"`
}

// ErrorResponse is every error answer: the message and, on a 409, the
// lock's holder (absent when the lock is free).
type ErrorResponse struct {
	Error  string    `json:"error"`
	Holder *LockInfo `json:"holder,omitempty"`
}

// StatusResponse is the 200 answer of a release ({"status":"released"}).
type StatusResponse struct {
	Status string `json:"status"`
}

// RenewResponse is the 200 answer of POST /locks/{id}/renew.
type RenewResponse struct {
	Status  string `json:"status"`
	Expires int64  `json:"expires"`
	Token   uint64 `json:"token"`
}

// ListResponse is the 200 answer of GET /locks.
type ListResponse struct {
	Data []LockInfo `json:"data"`
}

// Error messages of the lock routes, as the Express lock service's
// clients know them.
const (
	MsgHeld      = "Lock already held"
	MsgNotFound  = "Lock not found or expired"
	MsgTimeout   = "Consensus timeout"
	MsgOwnerTTL  = "owner and ttl are required"
	MsgNotHolder = "Not the lock holder"
)

func ptr[T any](v T) *T { return &v }
