// Package locktest is the conformance suite of lock.Locker: every lock
// backend (etcd in package lock, Redis and Redlock in lock/redislock, the
// Paxos lock service in lock/paxoslock) must pass Exercise, against a real
// backend. It checks what the interface promises whatever the backend:
// mutual exclusion, strictly increasing fencing tokens, fenced release
// (another locker, a wrong token or a stale retry release nothing),
// bounded waits, Status and List, renewal past many TTLs, and a holding
// that ends behind its holder's back cancelling the holder's context.
//
//	func TestConformance(t *testing.T) {
//		locktest.Exercise(context.Background(), t, func(t *testing.T, ns, id string) lock.Locker {
//			return newLocker(t, ns, 2*time.Second, id)
//		}, locktest.Options{TTL: 2 * time.Second, Expire: expire})
//	}
//
// What differs between backends (waiting in line, faults of a particular
// store, other processes killed or paused while they hold a lock) stays in
// each backend's own tests.
package locktest
