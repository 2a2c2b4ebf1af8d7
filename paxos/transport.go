package paxos

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
