// Package paxoslock is the backend of lock.Locker on drover's replicated
// lock service (package paxos, `drover paxos serve`), reached over its
// REST API through package paxos/client. It links neither the service's
// storage nor its transports.
//
// A grant's fencing token is the log index at which it was chosen. Locks
// are leases the service expires by its leader's clock; a watchdog
// (lock.Watchdog) renews each held lock every TTL/3 and cancels the
// holder's context when a renewal is refused or none succeeded for a
// whole TTL.
//
//	locker, err := paxoslock.New(paxoslock.Config{Endpoints: nodes, TTL: 10 * time.Second})
//	if err != nil { ... }
//	defer locker.Close(context.Background())
//	l, err := locker.Acquire(ctx, "report-42")
//	if err != nil { ... }
//	defer l.Release(context.Background())
package paxoslock
