package redislock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/droverhq/drover/lock"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/redis/go-redis/v9"
)

// redisRaise raises the fence counter to at least ARGV[1].
//
//	KEYS[1] fence key; ARGV[1] token; returns the counter afterwards
var redisRaise = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local t = tonumber(ARGV[1])
if cur < t then
  redis.call('SET', KEYS[1], ARGV[1])
  return t
end
return cur
`)

// RedlockConfig configures a Redlock locker.
type RedlockConfig struct {
	Namespace string
	// TTL of each lock on each server; zero means lock.DefaultTTL.
	TTL time.Duration
	// DriftFactor is the share of the TTL allowed for clock drift between
	// the servers (default 0.01, plus 2 ms).
	DriftFactor float64
	HolderID    string
	Logger      *slog.Logger
}

// Redlock is the Redlock backend of lock.Locker over N independent Redis servers
// (N odd, at least 3). A lock is held when a majority of the servers granted
// it within its validity time (TTL minus the time acquiring took minus the
// allowed drift); the holder's context ends when a renewal on a majority
// fails.
//
// What it does not guarantee: Redlock's safety rests on timing (bounded
// clock drift, bounded pauses, bounded network delay). A holder paused past
// its validity can act after another holder took over. The fencing token is
// what makes it safe to use: each server issues a counter with the lock, the
// token is the highest among the majority, and before the lock is reported
// taken, the majority's counters are raised to it. Any later majority shares
// a server with this one, so its token is higher: stores that refuse lower
// tokens refuse the stale holder.
type Redlock struct {
	nodes  []*Locker
	quorum int
	ttl    time.Duration
	drift  time.Duration
	logger *slog.Logger

	mu sync.Mutex
	// holdings are this locker's live locks by name, so that a release by
	// token ends the holding's context and its watchdog.
	holdings map[string]*RedlockLock
}

var _ lock.Locker = (*Redlock)(nil)

// NewRedlock returns a Redlock locker over clients, one per independent
// Redis server.
func NewRedlock(clients []redis.UniversalClient, cfg RedlockConfig) (*Redlock, error) {
	if len(clients) < 3 || len(clients)%2 == 0 {
		return nil, &drover.InputError{Field: "servers", Value: len(clients), Rule: "Redlock needs an odd number of independent Redis servers, at least 3"}
	}
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
	factor := cfg.DriftFactor
	if factor == 0 {
		factor = 0.01
	}
	if factor < 0 || factor >= 0.5 {
		return nil, &drover.InputError{Field: "drift factor", Value: factor, Rule: "must be between 0 and 0.5"}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	nonce := fmt.Sprintf("%016x", rand.Uint64())
	rl := &Redlock{quorum: len(clients)/2 + 1, ttl: ttl, drift: time.Duration(float64(ttl)*factor) + 2*time.Millisecond, logger: logger,
		holdings: map[string]*RedlockLock{}}
	for _, c := range clients {
		n, err := New(c, Config{Namespace: cfg.Namespace, TTL: ttl, HolderID: cfg.HolderID, Logger: logger})
		if err != nil {
			return nil, err
		}
		n.nonce = nonce // one holder identity on every server
		rl.nodes = append(rl.nodes, n)
	}
	return rl, nil
}

// each runs f on every server at once and returns the results in order.
func (rl *Redlock) each(f func(i int, n *Locker) (int64, error)) ([]int64, []error) {
	out, errs := make([]int64, len(rl.nodes)), make([]error, len(rl.nodes))
	var wg sync.WaitGroup
	for i, n := range rl.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = f(i, n)
		}()
	}
	wg.Wait()
	return out, errs
}

// TryAcquire makes one attempt on every server.
func (rl *Redlock) TryAcquire(ctx context.Context, name string) (lock.Lock, error) {
	if err := lock.CheckName(name); err != nil {
		return nil, err
	}
	base := rl.nodes[0]
	h := base.holder
	h.AcquiredAt = time.Now().UTC()
	rec, _ := json.Marshal(h)
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, rl.ttl/2)
	defer cancel()
	var held *lock.HeldError
	var mu sync.Mutex
	tokens, errs := rl.each(func(i int, n *Locker) (int64, error) {
		res, err := redisAcquire.Run(actx, n.rdb, []string{n.holderKey(name), n.fenceKey(name)},
			rl.ttl.Milliseconds(), n.nonce+" "+string(rec), time.Now().UnixMicro()).Slice()
		if err != nil {
			return 0, err
		}
		t, _ := res[0].(int64)
		if t == 0 && len(res) > 1 {
			if v, ok := res[1].(string); ok {
				mu.Lock()
				if held == nil {
					held = &lock.HeldError{Name: name}
					held.Token, _, held.Holder = parseHolder(v)
				}
				mu.Unlock()
			}
		}
		return t, nil
	})
	var got []int
	var token int64
	for i, t := range tokens {
		if errs[i] == nil && t > 0 {
			got = append(got, i)
			token = max(token, t)
		}
	}
	validity := rl.ttl - time.Since(start) - rl.drift
	if len(got) >= rl.quorum && validity > 0 {
		// Raise the majority's counters to the token before using it.
		raised, rerrs := rl.each(func(i int, n *Locker) (int64, error) {
			return redisRaise.Run(actx, n.rdb, []string{n.fenceKey(name)}, token).Int64()
		})
		ok := 0
		for i := range raised {
			if rerrs[i] == nil && raised[i] >= token {
				ok++
			}
		}
		if ok >= rl.quorum {
			l := &RedlockLock{rl: rl, name: name, token: token, holder: h, validUntil: start.Add(rl.ttl - rl.drift)}
			l.ctx, l.cancel = context.WithCancelCause(context.Background())
			l.done = make(chan struct{})
			rl.mu.Lock()
			rl.holdings[name] = l
			rl.mu.Unlock()
			go l.watchdog()
			return l, nil
		}
	}
	rl.releaseAll(name)
	if held == nil {
		held = &lock.HeldError{Name: name}
	}
	if err := errors.Join(errs...); err != nil && len(got)+countHeld(tokens, errs) < rl.quorum {
		return nil, fmt.Errorf("lock: redlock %q: only %d of %d servers answered: %w", name, len(got)+countHeld(tokens, errs), len(rl.nodes), err)
	}
	return nil, held
}

func countHeld(tokens []int64, errs []error) int {
	n := 0
	for i := range tokens {
		if errs[i] == nil && tokens[i] == 0 {
			n++
		}
	}
	return n
}

// releaseAll releases name on every server where this holder has it.
func (rl *Redlock) releaseAll(name string) int {
	ctx, cancel := context.WithTimeout(context.Background(), rl.ttl/2)
	defer cancel()
	res, _ := rl.each(func(i int, n *Locker) (int64, error) {
		// The holder value starts "TOKEN NONCE": the token is the one each
		// server issued, so match on the nonce alone.
		v, err := n.rdb.Get(ctx, n.holderKey(name)).Result()
		if err != nil {
			return 0, err
		}
		t, nonce, _ := parseHolder(v)
		if nonce != n.nonce {
			return 0, nil
		}
		return redisRelease.Run(ctx, n.rdb, []string{n.holderKey(name)}, fmt.Sprintf("%d %s ", t, n.nonce)).Int64()
	})
	released := 0
	for _, r := range res {
		released += int(r)
	}
	return released
}

// Acquire tries until it holds name or ctx ends, with jittered backoff.
func (rl *Redlock) Acquire(ctx context.Context, name string) (lock.Lock, error) {
	return lock.PollAcquire(ctx, name, rl.TryAcquire)
}

// Release releases name if this locker holds it with token (on a majority).
// The holding's context ends with lock.ErrReleased, as Lock.Release ends it.
func (rl *Redlock) Release(ctx context.Context, name string, token int64) error {
	if err := lock.CheckName(name); err != nil {
		return err
	}
	st, err := rl.Status(ctx, name)
	if err != nil {
		return err
	}
	if !st.Held || st.Token != token || rl.releaseAll(name) < rl.quorum {
		return &lock.NotHeldError{Name: name, Token: token, Current: st}
	}
	rl.mu.Lock()
	l := rl.holdings[name]
	rl.mu.Unlock()
	if l != nil && l.token == token {
		l.cancel(lock.ErrReleased)
		<-l.done
	}
	return nil
}

// Status reports the holder a majority of the servers agree on.
func (rl *Redlock) Status(ctx context.Context, name string) (lock.Status, error) {
	if err := lock.CheckName(name); err != nil {
		return lock.Status{}, err
	}
	sts := make([]lock.Status, len(rl.nodes))
	_, errs := rl.each(func(i int, n *Locker) (int64, error) {
		st, err := n.Status(ctx, name)
		sts[i] = st
		return 0, err
	})
	count := map[string]int{}
	for i, st := range sts {
		if errs[i] == nil && st.Held {
			count[st.Holder.ID+"|"+st.Holder.AcquiredAt.String()]++
		}
	}
	for i, st := range sts {
		if errs[i] == nil && st.Held && count[st.Holder.ID+"|"+st.Holder.AcquiredAt.String()] >= rl.quorum {
			// The token a holder uses is the highest of its majority.
			for j := range sts {
				if errs[j] == nil && sts[j].Held && sts[j].Holder == st.Holder && sts[j].Token > st.Token {
					st.Token = sts[j].Token
				}
			}
			return st, nil
		}
	}
	return lock.Status{Name: name, TTL: -1}, nil
}

// List returns the locks a majority of the servers agree are held.
func (rl *Redlock) List(ctx context.Context) ([]lock.Status, error) {
	seen := map[string]bool{}
	var out []lock.Status
	for _, n := range rl.nodes {
		sts, err := n.List(ctx)
		if err != nil {
			continue
		}
		for _, s := range sts {
			if seen[s.Name] {
				continue
			}
			seen[s.Name] = true
			if st, err := rl.Status(ctx, s.Name); err == nil && st.Held {
				out = append(out, st)
			}
		}
	}
	return out, nil
}

// RedlockLock is a lock held through Redlock.
type RedlockLock struct {
	rl         *Redlock
	name       string
	token      int64
	holder     lock.Holder
	ctx        context.Context
	cancel     context.CancelCauseFunc
	done       chan struct{}
	mu         sync.Mutex
	validUntil time.Time
}

var _ lock.Lock = (*RedlockLock)(nil)

// Name is the lock's name.
func (l *RedlockLock) Name() string { return l.name }

// Token is the fencing token: the highest counter of the majority.
func (l *RedlockLock) Token() int64 { return l.token }

// Holder is this holder's record.
func (l *RedlockLock) Holder() lock.Holder { return l.holder }

// Context ends when the lock's validity runs out without a majority renewal,
// or on release.
func (l *RedlockLock) Context() context.Context { return l.ctx }

// Err returns nil while the lock is valid, checking its validity time itself.
func (l *RedlockLock) Err() error {
	l.mu.Lock()
	late := time.Now().After(l.validUntil)
	l.mu.Unlock()
	if late {
		l.lose(errors.New("validity time passed"))
	}
	if l.ctx.Err() != nil {
		return context.Cause(l.ctx)
	}
	return nil
}

func (l *RedlockLock) lose(cause error) {
	lock.LoseOnce(l.ctx, l.cancel, l.rl.logger, "redlock", l.name, l.token, cause)
}

// watchdog renews on every server every TTL/3; a round that renews fewer
// than a majority before the validity runs out loses the lock.
func (l *RedlockLock) watchdog() {
	defer close(l.done)
	defer func() {
		l.rl.mu.Lock()
		if l.rl.holdings[l.name] == l {
			delete(l.rl.holdings, l.name)
		}
		l.rl.mu.Unlock()
	}()
	ttl := l.rl.ttl
	t := time.NewTimer(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		valid := l.validUntil
		l.mu.Unlock()
		if !time.Now().Before(valid) {
			l.lose(errors.New("validity time passed"))
			return
		}
		start := time.Now()
		ctx, cancel := context.WithDeadline(l.ctx, valid)
		res, errs := l.rl.each(func(i int, n *Locker) (int64, error) {
			v, err := n.rdb.Get(ctx, n.holderKey(l.name)).Result()
			if err != nil {
				return 0, err
			}
			tok, nonce, _ := parseHolder(v)
			if nonce != n.nonce {
				return 0, nil
			}
			return redisExtend.Run(ctx, n.rdb, []string{n.holderKey(l.name)}, fmt.Sprintf("%d %s ", tok, n.nonce), ttl.Milliseconds()).Int64()
		})
		cancel()
		ok := 0
		for i := range res {
			if errs[i] == nil && res[i] == 1 {
				ok++
			}
		}
		if ok >= l.rl.quorum {
			l.mu.Lock()
			l.validUntil = start.Add(ttl - l.rl.drift)
			l.mu.Unlock()
			t.Reset(ttl / 3)
			continue
		}
		t.Reset(min(200*time.Millisecond, time.Until(valid)))
	}
}

// Release releases the lock on every server and cancels its context.
func (l *RedlockLock) Release(ctx context.Context) error {
	released := l.rl.releaseAll(l.name)
	if released < l.rl.quorum {
		l.lose(errors.New("released after the lock was lost"))
		<-l.done
		return &lock.NotHeldError{Name: l.name, Token: l.token}
	}
	l.cancel(lock.ErrReleased)
	<-l.done
	return nil
}
