package paxos

import (
	"encoding/json"
	"fmt"

	"github.com/droverhq/drover/paxos/client"
)

// The wire types the server shares with its client.
type (
	// NodeID names one node of a group (client.NodeID).
	NodeID = client.NodeID
	// Ballot is a proposal number (client.Ballot).
	Ballot = client.Ballot
	// Peer is one member of the group and its address (client.Peer).
	Peer = client.Peer
	// NodeStatus is a node's view of the group (client.NodeStatus).
	NodeStatus = client.NodeStatus
	// PeerStatus is one member as a node sees it (client.PeerStatus).
	PeerStatus = client.PeerStatus
	// LockInfo is a held lock as the API shows it (client.LockInfo).
	LockInfo = client.LockInfo
	// AcquireResponse is the 200 answer of POST /locks/{id}
	// (client.AcquireResponse).
	AcquireResponse = client.AcquireResponse
	// GrantDetails describes a grant (client.GrantDetails).
	GrantDetails = client.GrantDetails
)

// Transport carries messages between the nodes of one group. It is best
// effort: a message may be lost, duplicated, delayed or reordered, and the
// node copes with all four (every message is idempotent by ballot and
// slot). Implementations: RabbitMQ (AMQP), direct (TCP via HTTP upgrade),
// and an in-memory network with fault injection for tests.
type Transport interface {
	// Send delivers m to node m.To. It does not wait for the receiver and
	// must not block for long: a slow or absent peer costs a dropped
	// message, never a stuck sender. An error means m was not sent.
	Send(m Message) error
	// Recv is the stream of messages addressed to this node. It is closed
	// by Close.
	Recv() <-chan Message
	// SetPeers tells the transport where the group's members are (the
	// direct transport dials Addr; others may ignore it). Called at start
	// and after every membership change.
	SetPeers(peers []Peer)
	// Close stops delivery and releases connections. Safe to call twice.
	Close() error
}

// MsgType says what a Message is.
type MsgType uint8

// Message types. Phase 1 (Prepare, Promise) runs once per ballot for every
// future slot; phase 2 (Accept, Accepted) runs per batch of slots. A
// campaign is preceded by a vote that changes no state (PrePrepare,
// PrePromise; see election.go).
const (
	MsgPrepare MsgType = iota + 1
	MsgPromise
	MsgAccept
	MsgAccepted
	MsgNack
	MsgHeartbeat
	MsgHeartbeatAck
	MsgCatchUp
	MsgCatchUpReply
	MsgForward
	MsgPrePrepare
	MsgPrePromise

	// msgLast is the highest type Decode accepts.
	msgLast = MsgPrePromise
)

var msgNames = map[MsgType]string{
	MsgPrepare: "prepare", MsgPromise: "promise", MsgAccept: "accept", MsgAccepted: "accepted",
	MsgNack: "nack", MsgHeartbeat: "heartbeat", MsgHeartbeatAck: "heartbeat-ack",
	MsgCatchUp: "catch-up", MsgCatchUpReply: "catch-up-reply", MsgForward: "forward",
	MsgPrePrepare: "pre-prepare", MsgPrePromise: "pre-promise",
}

// String names the type.
func (t MsgType) String() string {
	if s, ok := msgNames[t]; ok {
		return s
	}
	return fmt.Sprintf("msg(%d)", uint8(t))
}

// Message is what nodes send each other. Transports carry it as the bytes
// Encode makes and treat it as opaque except for Group, From and To. The
// fields a type uses are listed at the type's handler in the node.
type Message struct {
	Type  MsgType `json:"t"`
	Group string  `json:"g"`
	From  NodeID  `json:"f"`
	To    NodeID  `json:"to"`
	// Ballot is the sender's ballot (a Nack carries the higher promise).
	Ballot Ballot `json:"b"`
	// Slot is a first slot: of a Prepare's range, of a catch-up request.
	Slot uint64 `json:"s,omitempty"`
	// Last is a last slot: the end of an Accepted range.
	Last uint64 `json:"l,omitempty"`
	// Commit is the sender's commit index: every slot up to it is chosen.
	Commit uint64 `json:"c,omitempty"`
	// Entries are accepted values (Promise), values to accept (Accept) or
	// chosen values (catch-up reply).
	Entries []Entry `json:"e,omitempty"`
	// Commands are client commands forwarded to the leader.
	Commands []Command `json:"cmd,omitempty"`
	// Snapshot is a state transfer in a catch-up reply.
	Snapshot *Snapshot `json:"snap,omitempty"`
	// Seq matches a reply to its request (heartbeat acks, catch-ups, the
	// rounds of a vote before a campaign).
	Seq uint64 `json:"q,omitempty"`
}

// Entry is a value in one slot of the log, with the ballot that proposed
// it.
type Entry struct {
	Slot   uint64  `json:"s"`
	Ballot Ballot  `json:"b"`
	Cmd    Command `json:"c"`
}

// Snapshot is the state machine as of Index, with the group's
// configuration then. It replaces every log entry up to Index.
type Snapshot struct {
	Index   uint64 `json:"i"`
	Members []Peer `json:"m"`
	Data    []byte `json:"d"`
}

// Encode serializes m for a transport.
func Encode(m Message) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("paxos: encode %s: %w", m.Type, err)
	}
	return b, nil
}

// Decode parses what Encode made.
func Decode(b []byte) (Message, error) {
	var m Message
	if err := json.Unmarshal(b, &m); err != nil {
		return Message{}, fmt.Errorf("paxos: decode message: %w", err)
	}
	if m.Type == 0 || m.Type > msgLast {
		return Message{}, fmt.Errorf("paxos: decode message: unknown type %d", m.Type)
	}
	return m, nil
}
