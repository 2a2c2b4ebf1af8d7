package paxos

import (
	"encoding/json"
	"fmt"
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

// MsgType says what a Message is.
type MsgType uint8

// Message types. Phase 1 (Prepare, Promise) runs once per ballot for every
// future slot; phase 2 (Accept, Accepted) runs per batch of slots.
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
)

var msgNames = map[MsgType]string{
	MsgPrepare: "prepare", MsgPromise: "promise", MsgAccept: "accept", MsgAccepted: "accepted",
	MsgNack: "nack", MsgHeartbeat: "heartbeat", MsgHeartbeatAck: "heartbeat-ack",
	MsgCatchUp: "catch-up", MsgCatchUpReply: "catch-up-reply", MsgForward: "forward",
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
	// Seq matches a reply to its request (heartbeat acks, catch-ups).
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

// Peer is one member of the group and the address its direct transport
// and HTTP API answer on (empty over RabbitMQ, where nodes need no
// addresses to reach each other).
type Peer struct {
	ID   NodeID `json:"id"`
	Addr string `json:"addr,omitempty"`
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
	if m.Type == 0 || m.Type > MsgForward {
		return Message{}, fmt.Errorf("paxos: decode message: unknown type %d", m.Type)
	}
	return m, nil
}
