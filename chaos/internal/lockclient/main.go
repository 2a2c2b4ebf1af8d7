// Command lockclient is the lock client of the chaos tests: it runs
// CHAOS_CYCLES cycles of acquire, fenced write, release on random names of
// CHAOS_NAMES against one of drover's lock backends, and prints one line
// per operation on standard output, with the wall-clock times (Unix ns, one
// clock for every process on the machine) of its call and return:
//
//	OP client kind name token result call return
//	HOLD client name token      (a long hold begins: a chance to pause or kill it)
//	LOST client name token ns kind (from ns on, the lock may be gone: see lostAt;
//	                                kind: what the loss came from, see lossKind)
//	DONE client
//
// SIGTERM ends it between two cycles: the cycle under way finishes (its
// release settled and printed), then it prints DONE and exits 0, so that a
// test can stop clients that run for as long as it needs them without
// leaving an operation half reported.
//
// kind is acquire, write or release; result is ok, refused (a write the
// store refused), refused-here (a write the client refused itself, knowing
// the lock lost), notheld (a release of a lock not held), ambiguous (a
// release that may have applied; the lock is not held after it), or err
// (unknown outcome).
//
// The environment: CHAOS_BACKEND (etcd or redis), CHAOS_ADDR (etcd
// endpoints, comma-separated, or the Redis address), CHAOS_NS (namespace),
// CHAOS_CLIENT (its number), CHAOS_CYCLES (cycles that acquire the lock;
// failed acquisitions are retried, up to three times as many attempts),
// CHAOS_TTL, CHAOS_NAMES, and
// CHAOS_LONG_EVERY (every so many cycles, a 100 ms hold announced with
// HOLD).
package main

import (
	"github.com/droverhq/drover/lock/redislock"

	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/droverhq/drover/lock"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// lockBackend is what a lock client needs of a backend.
type lockBackend struct {
	locker lock.Locker
	// write writes value to the store fenced by l; cycle picks the path.
	// It returns resOK, resRefused (the store refused it) or
	// resRefusedHere (this process refused it, knowing the lock lost).
	write func(ctx context.Context, l lock.Lock, cycle int, value string) (result string, err error)
	// deadline is when the locker's lease is lost unless renewed (zero
	// for backends without one).
	deadline func() time.Time
	// leaseLost reports whether the locker's lease is lost (after a pause
	// or an outage longer than its TTL): then it can take no lock again.
	leaseLost func() bool
	close     func()
	errors    map[string]int // errors seen, by operation
}

// redisFencedSet sets the store key only while the holder key holds
// TOKEN: the store is fenced by the lock itself, atomically, as etcd's
// compare on the lock key's create revision fences a write there.
//
//	KEYS[1] the lock's holder key ("TOKEN NONCE RECORD"), KEYS[2] the store key
//	ARGV[1] token, ARGV[2] value; returns 1 if written
var redisFencedSet = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ' ' then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0
`)

// newLockBackend connects to the backend the environment names.
func newLockBackend(ctx context.Context, id int) (*lockBackend, error) {
	ns, ttl := os.Getenv("CHAOS_NS"), envDuration("CHAOS_TTL")
	switch os.Getenv("CHAOS_BACKEND") {
	case "etcd":
		cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv("CHAOS_ADDR"), ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, err
		}
		e, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: ttl, HolderID: fmt.Sprintf("c%d", id)})
		if err != nil {
			cli.Close()
			return nil, err
		}
		return &lockBackend{locker: e, deadline: e.Lease().Deadline, leaseLost: func() bool { return e.Lease().Err() != nil },
			write: func(ctx context.Context, l lock.Lock, cycle int, value string) (string, error) {
				el := l.(*lock.EtcdLock)
				put := clientv3.OpPut("/chaos-store/"+ns+"/"+l.Name(), value)
				if cycle%2 == 0 { // the bare compare: etcd alone decides
					resp, err := cli.Txn(ctx).If(el.Cmp()).Then(put).Commit()
					return accepted(err == nil && resp.Succeeded), err
				}
				_, err := el.Txn(ctx).Then(put).Commit() // drover's fenced transaction
				switch {
				case err == nil:
					return resOK, nil
				case !errors.Is(err, lock.ErrFenced):
					return "", err
				case strings.Contains(err.Error(), "was refused"): // lease.NewFencedTxn: etcd refused it
					return resRefused, nil
				}
				return resRefusedHere, nil // its own check (a passed lease deadline, a loss seen) refused it
			},
			close: func() { _ = e.Close(context.Background()); _ = cli.Close() }}, nil
	case "redis":
		rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("CHAOS_ADDR"), MaxRetries: -1})
		r, err := redislock.New(rdb, redislock.Config{Namespace: ns, TTL: ttl, HolderID: fmt.Sprintf("c%d", id)})
		if err != nil {
			rdb.Close()
			return nil, err
		}
		return &lockBackend{locker: r, deadline: func() time.Time { return time.Time{} }, leaseLost: func() bool { return false },
			write: func(ctx context.Context, l lock.Lock, _ int, value string) (string, error) {
				tag := "drover:{" + ns + ":" + l.Name() + "}:"
				n, err := redisFencedSet.Run(ctx, rdb, []string{tag + "holder", tag + "chaos-store"}, l.Token(), value).Int()
				return accepted(err == nil && n == 1), err
			},
			close: func() { _ = rdb.Close() }}, nil
	}
	return nil, fmt.Errorf("CHAOS_BACKEND %q: want etcd or redis", os.Getenv("CHAOS_BACKEND"))
}

func envDuration(k string) time.Duration { d, _ := time.ParseDuration(os.Getenv(k)); return d }
func envInt(k string) int                { n, _ := strconv.Atoi(os.Getenv(k)); return n }

func main() { os.Exit(run()) }

// Operation kinds and results, as the chaos tests' history reads them.
const (
	opAcquire    = "acquire"
	opWrite      = "write"
	opRelease    = "release"
	resOK        = "ok"
	resRefused   = "refused"
	resNotHeld   = "notheld"
	resAmbiguous = "ambiguous"
	// resRefusedHere is a write the client refused itself, before etcd
	// saw it: it says what the client knew, not what the store holds.
	resRefusedHere = "refused-here"
)

// accepted is resOK or resRefused.
func accepted(ok bool) string {
	if ok {
		return resOK
	}
	return resRefused
}

func run() int {
	ctx := context.Background()
	stop, unhook := signal.NotifyContext(ctx, syscall.SIGTERM) // ends the loop only, never an operation
	defer unhook()
	id, cycles, longEvery := envInt("CHAOS_CLIENT"), envInt("CHAOS_CYCLES"), envInt("CHAOS_LONG_EVERY")
	names := strings.Split(os.Getenv("CHAOS_NAMES"), ",")
	b, err := newLockBackend(ctx, id)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lock client:", err)
		return 2
	}
	b.errors = map[string]int{}
	defer func() { b.close() }()
	rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	// Cycles whose acquisition failed (etcd without a leader, a server
	// restarting) do not count, up to three times as many attempts.
	for i, done := 0, 0; done < cycles && i < 3*cycles && stop.Err() == nil; i++ {
		name := names[rng.IntN(len(names))]
		hold := time.Duration(rng.IntN(3)) * time.Millisecond
		if longEvery > 0 && i%longEvery == longEvery-1 {
			hold = -100 * time.Millisecond // a long hold, announced
		}
		if b.leaseLost() { // a new locker, with a lease of its own
			b.close()
			if b, err = newLockBackend(ctx, id); err != nil {
				fmt.Fprintln(os.Stderr, "lock client:", err)
				return 2
			}
			b.errors = map[string]int{}
		}
		acquired, settled := b.cycle(ctx, id, i, name, hold)
		if !settled {
			return 3
		}
		if acquired {
			done++
		}
	}
	fmt.Printf("DONE %d\n", id)
	return 0
}

// now is the clock of every history: wall-clock Unix ns.
func now() int64 { return time.Now().UnixNano() }

// op prints one operation.
func op(id int, kind, name string, token int64, result string, call int64) {
	fmt.Printf("OP %d %s %s %d %s %d %d\n", id, kind, name, token, result, call, now())
}

// cycle runs one acquire, fenced write, release on name, holding the lock
// for hold in between (a negative hold is a long one, announced with a
// HOLD line). It reports whether it acquired the lock, and whether its
// release was settled.
func (b *lockBackend) cycle(ctx context.Context, id, i int, name string, hold time.Duration) (acquired, settled bool) {
	call := now()
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	l, err := b.locker.Acquire(actx, name)
	cancel()
	if err != nil {
		op(id, opAcquire, name, 0, "err", call)
		b.logError("acquire", err)
		time.Sleep(20 * time.Millisecond)
		return false, true
	}
	op(id, opAcquire, name, l.Token(), resOK, call)
	lost := b.watchLoss(id, l)
	path := i // which write path (etcd): even, the bare compare; odd, drover's fenced transaction
	if hold < 0 {
		fmt.Printf("HOLD %d %s %d\n", id, name, l.Token())
		hold, path = -hold, 0 // a holder paused now meets etcd's own fence when it wakes
	}
	time.Sleep(hold)
	lost()
	call = now()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	res, err := b.write(wctx, l, path, fmt.Sprintf("c%d-%d", id, i))
	cancel()
	if err != nil {
		res = "err"
		b.logError("write", err)
	}
	op(id, opWrite, name, l.Token(), res, call)
	lost()
	call = now()
	res = b.release(ctx, l)
	op(id, opRelease, name, l.Token(), res, call)
	return true, res != "err"
}

// logError writes the first errors of each kind of operation to standard
// error, for the test's report.
func (b *lockBackend) logError(what string, err error) {
	b.errors[what]++
	if b.errors[what] <= 3 {
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
	}
}

// watchLoss reports the loss of l, once, with a LOST line: when its
// context ends with lock.ErrLost, or when the returned check finds l.Err()
// says so. The line's time is lostAt.
func (b *lockBackend) watchLoss(id int, l lock.Lock) (check func()) {
	var once sync.Once
	report := func(cause error) {
		once.Do(func() { fmt.Printf("LOST %d %s %d %d %s\n", id, l.Name(), l.Token(), b.lostAt(), lossKind(cause)) })
	}
	lctx := l.Context()
	go func() {
		<-lctx.Done()
		if cause := context.Cause(lctx); errors.Is(cause, lock.ErrLost) {
			report(cause)
		}
	}()
	type errer interface{ Err() error }
	return func() {
		if e, ok := l.(errer); ok && errors.Is(e.Err(), lock.ErrLost) {
			report(e.Err())
		}
	}
}

// lossKind names what a loss came from, as its cause says: "key" (the
// lock's key was deleted), "lease" (the lease was lost) or "other".
func lossKind(cause error) string {
	switch s := cause.Error(); {
	case strings.Contains(s, "lock key deleted"):
		return "key"
	case strings.Contains(s, "lease"):
		return "lease"
	}
	return "other"
}

// lostAt is the moment from which a lock this process found lost may be
// gone: now, or the lease's deadline when that passed already (etcd cannot
// expire the lease before it, and the process may learn of it later).
func (b *lockBackend) lostAt() int64 {
	if d := b.deadline(); !d.IsZero() && d.Before(time.Now()) {
		return d.UnixNano()
	}
	return now()
}

// release releases l and settles the outcome: an error is retried with
// the locker's Release by token until it says released (ok) or not held
// (ambiguous: the first try may have released it), at most 20 times.
func (b *lockBackend) release(ctx context.Context, l lock.Lock) string {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := l.Release(rctx)
	cancel()
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, lock.ErrNotHeld):
		return resNotHeld
	}
	for range 20 {
		time.Sleep(250 * time.Millisecond)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = b.locker.Release(rctx, l.Name(), l.Token())
		cancel()
		switch {
		case err == nil:
			return resOK
		case errors.Is(err, lock.ErrNotHeld):
			return resAmbiguous
		}
	}
	fmt.Fprintln(os.Stderr, "lock client: release never settled:", err)
	return "err"
}
