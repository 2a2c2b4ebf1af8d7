// Package drover is the coordination plane for fleets of AI agents: many
// processes on many machines that run long, expensive, multi-step tasks and
// must never run the same task twice at once, never lose a task, never lose an
// update to shared agent state, and recover on their own when a machine dies.
//
// The parts live in packages named after what they are:
//
//   - [github.com/droverhq/drover/cluster]: the embedded etcd server and the
//     client configuration every command shares.
//   - [github.com/droverhq/drover/keyspace]: the one place where etcd keys are
//     built.
//   - [github.com/droverhq/drover/lease]: etcd leases kept alive with a
//     deadline, whose loss cancels a context.
//   - [github.com/droverhq/drover/lock]: named locks with fencing tokens
//     behind a backend-neutral interface.
//
// This package holds what every part shares: the error type for bad input.
package drover
