// Package paxos is a replicated lock service: a lock table kept
// consistent on three or five nodes by Multi-Paxos, over RabbitMQ or a
// direct transport, behind a small REST API.
//
// Each node is proposer, acceptor and learner. A stable leader runs phase 1
// once for every future slot and phase 2 per batch of commands; followers
// detect a failed leader by missed heartbeats and replace it after a
// randomized backoff, so proposers do not livelock. Acceptor state is
// fsynced before any reply; snapshots of the table truncate the log. A
// grant's fencing token is its log index.
package paxos
