// Package lease keeps etcd leases alive and turns their loss into context
// cancellation.
//
// A [Lease] is granted with a TTL and renewed in the background every TTL/3.
// Each renewal has a deadline: the moment the lease may expire on the server,
// counted from when the last successful renewal was sent. When that deadline
// passes without a successful renewal, the lease is lost even if no error came
// back (etcd unreachable, a hung connection, a paused process), and so it is
// when etcd says the lease no longer exists (expired or revoked). On loss,
// the lease's context is cancelled at once, with a [LostError] as its cause,
// and the loss is logged once with the lease ID and the cause.
//
// Code that works under a lease passes [Lease.Context] into its calls, so an
// abandoned piece of work stops as soon as the right to do it is gone:
//
//	l, err := lease.Grant(ctx, cli, 10*time.Second)
//	if err != nil { ... }
//	defer l.Close(context.Background()) // revokes: keys bound to it vanish at once
//	resp, err := llm.Call(l.Context(), prompt)
//
// A process's primary lease, which everything it registers is bound to, is
// package process's: its Runtime grants one lease with this package and
// keeps it. [Attach] wraps a lease that something else keeps alive (an
// HTTP client's session) for the length of one request: it is never
// renewed, and its Close does not revoke it.
//
// [Fence] is the one type of a right held under a lease (an etcd lock, a
// queue task's claim, a task runner's hold on its task), and [NewFencedTxn]
// the etcd transaction that commits only while such a right is held.
// [NewTokenTxn] fences etcd writes by a token
// alone, for a right held outside etcd (a lock on Redis, Redlock or the
// Paxos service): etcd keeps the highest token that wrote, and refuses
// lower ones.
package lease
