package chaos

import (
	"github.com/droverhq/drover/lock/redislock"

	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// stallConn is a connection whose next Read waits first, once armed: the
// process reads a reply late, as a process paused (GC, SIGSTOP) between the
// server's work and its reading of the answer would.
type stallConn struct {
	net.Conn
	stall *atomic.Int64 // ns to wait before the next Read; 0: none
}

// Read implements net.Conn.
func (c stallConn) Read(p []byte) (int, error) {
	if d := c.stall.Swap(0); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return c.Conn.Read(p)
}

// TestRedisLockDeadlineCountsFromReply: the client-side deadline of a
// Redis lock just acquired counts from when the request was sent, so a
// holder that reads the reply late knows the lock lost once Redis dropped
// it.
//
// Found broken while writing these tests: TryAcquire started the watchdog
// with the time the reply was read (lock/redis.go), while Redis starts the
// holder key's TTL when it runs the script. A holder that read its reply
// late (paused by GC or SIGSTOP, a slow network) believed it held the lock
// for up to a TTL after Redis dropped it: Err() nil, context live, while
// another locker held it. It now counts from the send, as the Paxos backend
// does.
//
// TTL 1 s; the acquisition's reply is read 1.5 s after Redis ran it (a
// connection that stalls one read); a second locker takes the lock, and
// the first must report the loss.
//
//	go test -run TestRedisLockDeadlineCountsFromReply -v ./chaos/
func TestRedisLockDeadlineCountsFromReply(t *testing.T) {
	srv := startRedis(t, "--save", "", "--appendonly", "no")
	ctx := context.Background()
	var stall atomic.Int64
	slow := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1, PoolSize: 1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			return stallConn{Conn: c, stall: &stall}, err
		}})
	defer slow.Close()
	fast := redis.NewClient(&redis.Options{Addr: srv.addr})
	defer fast.Close()
	ttl := time.Second
	a, err := redislock.New(slow, redislock.Config{Namespace: "bug", TTL: ttl, HolderID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := redislock.New(fast, redislock.Config{Namespace: "bug", TTL: ttl, HolderID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	// Load the scripts on the server and open the connection first, so
	// that the stalled read is the acquisition's answer.
	warm, err := a.TryAcquire(ctx, "warm-up")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stall.Store(int64(ttl + 500*time.Millisecond))
	la, err := a.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = la.Release(ctx) }() // refused: it was lost
	lb, err := b.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatalf("the second locker could not take the lock (%v): Redis kept the first holder's key past its TTL", err)
	}
	defer func() { _ = lb.Release(ctx) }()
	errA := la.(interface{ Err() error }).Err()
	if errA == nil && la.Context().Err() == nil {
		t.Fatalf("locker b holds x with token %d, yet locker a's lock (token %d) reports no loss: Err() nil, context live; its deadline counts from the reply read %s after Redis set the key's TTL of %s",
			lb.Token(), la.Token(), ttl+500*time.Millisecond, ttl)
	}
}
