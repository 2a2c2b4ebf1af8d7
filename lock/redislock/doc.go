// Package redislock holds the Redis backends of lock.Locker: [Locker], a
// lock on one Redis server, and [Redlock], a lock granted by a majority of
// independent Redis servers. Both issue fencing tokens with each grant, so
// stores that refuse lower tokens stay safe where Redis alone is not (a
// failover that lost a SET, a holder paused past its TTL), and both keep a
// held lock alive with a watchdog (lock.Watchdog) that cancels the
// holder's context the moment the lock is lost.
//
//	locker, err := redislock.New(rdb, redislock.Config{TTL: 15 * time.Second})
//	if err != nil { ... }
//	l, err := locker.Acquire(ctx, "report-42")
//	if err != nil { ... }
//	defer l.Release(context.Background())
//	write(l.Context(), l.Token()) // stores refuse tokens below the highest seen
//
// Waiters poll with jittered backoff: waiting is not first come, first
// served. Keys of lock NAME in namespace NS share the hash tag {NS:NAME},
// so both of a lock's keys live in one Redis Cluster slot.
package redislock
