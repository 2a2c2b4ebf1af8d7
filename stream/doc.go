// Package stream is a task's stream: the events a running task emits
// (model tokens, progress, log lines, partial results), kept in etcd and
// followed by any number of consumers, from any event, before, during or
// after the task runs.
//
// A stream is written under its attempt's claim (a queue task's claim,
// queue.ClaimFence): an attempt that lost its claim gets ErrFenced and
// stores nothing more. The next attempt opens with attempt_lost (when the
// one before ended without saying so) and attempt_started, and every
// write is a create of the chunk at the stream's next sequence number, so
// nothing of an older attempt can land after that boundary.
//
// Writes are coalesced: a process's Writer sends the new events of every
// stream it writes in one etcd transaction per few milliseconds (a group
// commit across streams, internal/groupcommit), each stream's part one
// chunk key of its events, fenced on its own. etcd's write rate grows with
// time, not with events. A process's Hub keeps one etcd watch per
// followed stream for all of its followers.
//
// In a handler or step run by a queue worker (Emit queues the event and
// returns; Flush waits until the attempt's events are stored):
//
//	stream.Emit(ctx, "progress", map[string]int{"done": 3, "of": 12})
//	stream.Token(ctx, "Hel")
//
// To follow:
//
//	for ev, err := range stream.HubFor(cli, keys).Follow(ctx, id, 1) { ... }
//
// Keys: keyspace.Space.StreamChunks. Streams are removed by their expiry
// keys (Retention after the task's end, MaxAge after the last event)
// by any process's Writer.
package stream
