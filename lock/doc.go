// Package lock provides named locks with fencing tokens behind one
// backend-neutral interface, [Locker].
//
// A lock is held under a lease: when the holder dies, pauses or is cut off
// for longer than its TTL, the lock frees itself and the next waiter takes it.
// Because a paused holder may wake up still believing it holds the lock, every
// holding carries a fencing token that strictly increases per lock name each
// time the lock changes hands. Whatever the holder writes is made conditional
// on the token, so a write by a holder that was replaced is refused. The
// holder also gets a context that is cancelled the moment the lock is lost;
// passing it into LLM and tool calls stops work nobody will keep.
//
// The etcd backend, [Etcd], is the default. A contender creates a key under
// /{ns}/locks/{name}/ bound to its lease; the contender whose key has the
// lowest create revision holds the lock, and that revision is its fencing
// token. Waiters queue in arrival order, each watching only the key just
// ahead of it, with a watch opened at the current revision so that the
// release wakes it at once. [EtcdLock.Txn] makes any etcd transaction
// conditional on the lock still being held with its token.
//
//	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{TTL: 15 * time.Second})
//	if err != nil { ... }
//	defer locker.Close(context.Background())
//	l, err := locker.AcquireFenced(ctx, "report-42") // Acquire, as a lease.Fence
//	if err != nil { ... }
//	defer l.Release(context.Background())
//	resp, err := l.Txn(ctx).Then(clientv3.OpPut(k, v)).Commit()
//	if errors.Is(err, lock.ErrFenced) { ... the lock was lost; the write was refused }
//
// Other backends live in packages of their own, so that a program links
// only the one it uses: lock/redislock (Redis, and Redlock over several
// Redis servers) and lock/paxoslock (drover's Paxos lock service). They
// keep held locks with a [Watchdog] and wait with [PollAcquire]. Every
// backend passes the suite of lock/locktest.
package lock
