package redislock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover/lock"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/redis/go-redis/v9"
)

// Redis keys of lock NAME in namespace NS share one hash tag, so both live
// in one Redis Cluster slot:
//
//	drover:{NS:NAME}:holder   "TOKEN NONCE RECORD", with the lock's TTL
//	drover:{NS:NAME}:fence    the last fencing token issued (no TTL)

// redisAcquire takes the lock if it is free, and issues its fencing token in
// the same script, since SET NX issues none. The counter is raised before the
// SET NX (two calls on the common path instead of three); an attempt that
// finds the lock held skips a number, which keeps tokens strictly increasing
// across holders.
//
//	KEYS[1] holder key, KEYS[2] fence key
//	ARGV[1] TTL in ms, ARGV[2] "NONCE RECORD", ARGV[3] token floor
//	returns {token} when taken, {0, holder value, pttl} when held
//
// The token floor (the caller's clock in microseconds) keeps tokens
// increasing even if Redis lost the fence key (a restart without
// persistence), as long as clocks move forward. Tokens stay below 2^53, so
// Lua's numbers hold them exactly; '%.0f' writes them without an exponent.
var redisAcquire = redis.NewScript(`
local t = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if t < floor then
  redis.call('SET', KEYS[2], ARGV[3])
  t = floor
end
if redis.call('SET', KEYS[1], string.format('%.0f', t) .. ' ' .. ARGV[2], 'NX', 'PX', ARGV[1]) then
  return {t}
end
return {0, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
`)

// redisRelease deletes the holder key only if it still holds TOKEN NONCE.
//
//	KEYS[1] holder key; ARGV[1] "TOKEN NONCE "; returns 1 if released
var redisRelease = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// redisExtend renews the holder key's TTL only if it still holds TOKEN NONCE.
//
//	KEYS[1] holder key; ARGV[1] "TOKEN NONCE ", ARGV[2] TTL in ms;
//	returns 1 if renewed
var redisExtend = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// Config configures a Redis locker.
type Config struct {
	// Namespace of the keys; "" means "drover".
	Namespace string
	// TTL of each lock; zero means lock.DefaultTTL. A watchdog renews it
	// every TTL/3 while the lock is held.
	TTL time.Duration
	// HolderID names this worker in lock records; "" means "host:pid".
	HolderID string
	Logger   *slog.Logger
}

// Locker is the Redis backend of lock.Locker, a single-instance lock with
// fencing tokens: SET NX with a TTL, a fencing token issued atomically
// with it, compare-and-delete release, and a watchdog that renews the TTL
// at a third of it and cancels the holder's context the moment renewal
// fails or finds the lock taken.
//
// Redis gives weaker guarantees than etcd: a failover to a replica that had
// not yet received the SET can hand the lock to a second holder. The fencing
// token is what keeps that safe: stores must refuse tokens lower than the
// highest they have seen. Waiters poll with jittered backoff; there is no
// queue, so waiting is not first come, first served.
type Locker struct {
	rdb    redis.UniversalClient
	ns     string
	ttl    time.Duration
	holder lock.Holder
	nonce  string
	logger *slog.Logger
}

var _ lock.Locker = (*Locker)(nil)

// New returns a Redis locker on rdb.
func New(rdb redis.UniversalClient, cfg Config) (*Locker, error) {
	if _, err := keyspace.New(cfg.Namespace); err != nil {
		return nil, err
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = lock.DefaultTTL
	}
	if err := lease.CheckTTL("ttl", ttl); err != nil {
		return nil, err
	}
	ns := cfg.Namespace
	if ns == "" {
		ns = keyspace.DefaultNamespace
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Locker{rdb: rdb, ns: ns, ttl: ttl, holder: lock.NewHolder(cfg.HolderID), nonce: fmt.Sprintf("%016x", rand.Uint64()), logger: logger}, nil
}

func (r *Locker) holderKey(name string) string { return "drover:{" + r.ns + ":" + name + "}:holder" }
func (r *Locker) fenceKey(name string) string  { return "drover:{" + r.ns + ":" + name + "}:fence" }

// parseHolder splits "TOKEN NONCE RECORD".
func parseHolder(v string) (token int64, nonce string, h lock.Holder) {
	parts := strings.SplitN(v, " ", 3)
	if len(parts) > 0 {
		token, _ = strconv.ParseInt(parts[0], 10, 64)
	}
	if len(parts) > 1 {
		nonce = parts[1]
	}
	if len(parts) > 2 && json.Unmarshal([]byte(parts[2]), &h) != nil {
		h.ID = "unknown (unreadable record)"
	}
	return token, nonce, h
}

// TryAcquire makes one attempt to take name.
func (r *Locker) TryAcquire(ctx context.Context, name string) (lock.Lock, error) {
	if err := lock.CheckName(name); err != nil {
		return nil, err
	}
	h := r.holder
	h.AcquiredAt = time.Now().UTC()
	rec, _ := json.Marshal(h)
	// The holder's deadline counts from the send: Redis starts the key's
	// TTL when it runs the script, which a reply read late (a pause, a slow
	// network) must not push back.
	sent := time.Now()
	res, err := redisAcquire.Run(ctx, r.rdb, []string{r.holderKey(name), r.fenceKey(name)},
		r.ttl.Milliseconds(), r.nonce+" "+string(rec), time.Now().UnixMicro()).Slice()
	if err != nil {
		return nil, fmt.Errorf("lock: try-acquire %q on redis: %w", name, err)
	}
	token, _ := res[0].(int64)
	if token == 0 {
		herr := &lock.HeldError{Name: name}
		if len(res) > 1 {
			if v, ok := res[1].(string); ok {
				herr.Token, _, herr.Holder = parseHolder(v)
			}
		}
		return nil, herr
	}
	l := &Lock{name: name, token: token, holder: h}
	l.Start(sent, lock.WatchdogConfig{Backend: "redis", Name: name, Token: token, TTL: r.ttl, Logger: r.logger,
		Extend: func(ctx context.Context) (error, error) {
			n, err := redisExtend.Run(ctx, r.rdb, []string{r.holderKey(name)}, fmt.Sprintf("%d %s ", token, r.nonce), r.ttl.Milliseconds()).Int()
			if err == nil && n != 1 {
				return errors.New("redis reports the lock expired or taken by another holder"), nil
			}
			return nil, err
		},
		Release: func(ctx context.Context) error { return r.Release(ctx, name, token) },
	})
	return l, nil
}

// Acquire tries until it holds name or ctx ends, backing off with jitter
// from 10 ms to 250 ms between attempts.
func (r *Locker) Acquire(ctx context.Context, name string) (lock.Lock, error) {
	return lock.PollAcquire(ctx, name, r.TryAcquire)
}

// Release releases name if this locker holds it with token.
func (r *Locker) Release(ctx context.Context, name string, token int64) error {
	if err := lock.CheckName(name); err != nil {
		return err
	}
	n, err := redisRelease.Run(ctx, r.rdb, []string{r.holderKey(name)}, fmt.Sprintf("%d %s ", token, r.nonce)).Int()
	if err != nil {
		return fmt.Errorf("lock: release %q on redis: %w", name, err)
	}
	if n == 0 {
		nerr := &lock.NotHeldError{Name: name, Token: token}
		if st, err := r.Status(ctx, name); err == nil {
			nerr.Current = st
		}
		return nerr
	}
	return nil
}

// Status reads the holder of name.
func (r *Locker) Status(ctx context.Context, name string) (lock.Status, error) {
	if err := lock.CheckName(name); err != nil {
		return lock.Status{}, err
	}
	pipe := r.rdb.Pipeline()
	get := pipe.Get(ctx, r.holderKey(name))
	ttl := pipe.PTTL(ctx, r.holderKey(name))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return lock.Status{}, fmt.Errorf("lock: status %q on redis: %w", name, err)
	}
	st := lock.Status{Name: name, TTL: -1}
	if v, err := get.Result(); err == nil {
		st.Held = true
		st.Token, _, st.Holder = parseHolder(v)
		if d, err := ttl.Result(); err == nil && d >= 0 {
			st.TTL = d
		}
	}
	return st, nil
}

// List returns every held lock of the namespace, ordered by name.
func (r *Locker) List(ctx context.Context) ([]lock.Status, error) {
	var out []lock.Status
	iter := r.rdb.Scan(ctx, 0, "drover:{"+r.ns+":*}:holder", 500).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		name := strings.TrimSuffix(strings.TrimPrefix(k, "drover:{"+r.ns+":"), "}:holder")
		st, err := r.Status(ctx, name)
		if err != nil {
			return nil, err
		}
		if st.Held {
			out = append(out, st)
		}
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("lock: list on redis: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Lock is a lock held through the Redis backend.
type Lock struct {
	lock.Watchdog
	name   string
	token  int64
	holder lock.Holder
}

var _ lock.Lock = (*Lock)(nil)

// Name is the lock's name.
func (l *Lock) Name() string { return l.name }

// Token is the fencing token Redis issued with the lock.
func (l *Lock) Token() int64 { return l.token }

// Holder is this holder's record.
func (l *Lock) Holder() lock.Holder { return l.holder }
