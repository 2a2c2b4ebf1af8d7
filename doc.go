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
//   - [github.com/droverhq/drover/kv]: small etcd transactions every part
//     uses: create if absent, compare-and-swap updates.
//   - [github.com/droverhq/drover/lease]: etcd leases kept alive with a
//     deadline, whose loss cancels a context; lease.Fence, the one type of
//     a right held under a lease, and its fenced transactions.
//   - [github.com/droverhq/drover/lease/fencetest]: the conformance suite
//     every lease.Fence passes.
//   - [github.com/droverhq/drover/process]: a process's primary lease, with
//     the goroutines that live under it.
//   - [github.com/droverhq/drover/lock]: named locks with fencing tokens
//     behind a backend-neutral interface, and its etcd backend.
//   - [github.com/droverhq/drover/lock/redislock]: the Redis and Redlock
//     backends of the lock interface.
//   - [github.com/droverhq/drover/lock/paxoslock]: the Paxos lock service as
//     a backend of the lock interface.
//   - [github.com/droverhq/drover/lock/locktest]: the conformance suite every
//     lock backend passes.
//   - [github.com/droverhq/drover/paxos]: a lock service of its own for
//     teams without etcd: a lock table replicated by Multi-Paxos over
//     RabbitMQ or a direct transport, with a REST API and fencing tokens.
//   - [github.com/droverhq/drover/paxos/client]: the lock service's Go
//     client and wire types, without the server's storage or transports.
//   - [github.com/droverhq/drover/task]: agent tasks run step by step under
//     a lock, each step's checkpoint written fenced, resumed after a crash.
//   - [github.com/droverhq/drover/queue]: durable task queues: batched
//     submission, fenced claims, retries, a dead-letter queue, workers.
//   - [github.com/droverhq/drover/queue/history]: a queue's history, a
//     minute at a time, as the servers close it.
//   - [github.com/droverhq/drover/stream]: a task's stream of events
//     (tokens, progress) to any number of followers, written under the
//     task's claim so that a lost attempt writes nothing after the next
//     one began, coalesced across streams, resumable from any event.
//   - [github.com/droverhq/drover/schedule]: tasks submitted on a cron
//     expression or an interval, once per tick across every server.
//   - [github.com/droverhq/drover/flow]: fleet-wide rate limits,
//     concurrency quotas and circuit breakers, as gates that admit calls.
//   - [github.com/droverhq/drover/budget]: LLM budgets: requests and tokens
//     per window under a provider/model/key, reserved before a call and
//     settled with what it used, shared between tenants by weight.
//   - [github.com/droverhq/drover/registry]: endpoints registered under a
//     process's lease, discovered by snapshot and watch.
//   - [github.com/droverhq/drover/fleet]: a queue worker assembled as
//     drover worker assembles one (primary lease, flow control gates,
//     worker, registry entry), for Go programs.
//   - [github.com/droverhq/drover/checkpoint]: agent state per thread, with
//     history, on etcd or PostgreSQL.
//   - [github.com/droverhq/drover/checkpoint/checkpointtest]: the
//     conformance suite every checkpoint store passes.
//   - [github.com/droverhq/drover/metrics]: the Prometheus metrics every
//     part records.
//   - [github.com/droverhq/drover/tracing]: OpenTelemetry set up from the
//     standard environment, and a task's trace context carried from its
//     submission to each of its attempts.
//   - [github.com/droverhq/drover/tracing/otelspan]: the spans and
//     exemplars the instrumented packages record, on the OpenTelemetry API
//     alone (no SDK, no exporter).
//   - [github.com/droverhq/drover/storeguard]: the store-full guard key that
//     data-plane writes compare, so that they yield before etcd's quota
//     stops the control plane (leases, locks); cluster.Guard sets it.
//   - [github.com/droverhq/drover/httpapi]: every capability as JSON routes
//     over HTTP, described by OpenAPI, with sessions standing in for
//     leases, bearer tokens and TLS, for agents in other languages.
//   - [github.com/droverhq/drover/agentserver]: LangGraph's Agent Server
//     routes (assistants, threads) for the official LangGraph SDK Client,
//     mounted by the HTTP API at its root.
//   - [github.com/droverhq/drover/ui]: the web dashboard the HTTP API
//     serves at /ui, embedded in the binary.
//   - [github.com/droverhq/drover/chaos]: tests only: crashes, pauses and
//     leader kills of real processes, and linearizability checks of locks.
//   - [github.com/droverhq/drover/cmd/drover]: the one binary.
//
// This package holds what every part shares: the error type for bad input,
// and the one for a write refused because etcd's database is near its quota
// ([StoreFullError], matched by [ErrStoreFull]).
package drover
