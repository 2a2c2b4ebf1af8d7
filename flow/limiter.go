package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/kv"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	// ErrNoLimit is returned for a rate limit that has no configuration.
	ErrNoLimit = errors.New("flow: rate limit not configured")
	// ErrExceedsBurst is returned for a reservation larger than the limit's
	// burst: the bucket can never hold that many tokens.
	ErrExceedsBurst = errors.New("flow: reservation exceeds the limit's burst")
)

// batchWindow is how much of a second's tokens a limiter takes from the
// shared bucket at once: one transaction serves many tasks, and tokens a
// worker holds but does not use are at most this much of the rate.
const batchWindow = 100 * time.Millisecond

// Limiter is one process's handle on a fleet-wide rate limit. Tokens come
// from a token bucket stored in etcd, taken in batches of about a tenth of a
// second's worth with one compare-and-swap transaction per batch; the
// process spends them locally. A reservation of n tokens (a request, or the
// estimated LLM tokens of a call) is settled with what was actually used;
// the difference is given back or taken as a debt. Close gives back what
// the process still holds, so that the bucket's recorded usage is exactly
// the sum of settled amounts.
//
// The bucket refills by each writer's clock (clamped so that it never runs
// backwards), so machines must keep their clocks synchronised (NTP): a
// writer whose clock is d ahead lets the fleet run ahead by d's worth of
// tokens once, and holds back the refill seen by the others for d.
// Settle every reservation before Close; one settled later still counts.
//
// No library gives a rate limit shared across processes through etcd with
// batched grants, so this one is drover's own; golang.org/x/time/rate
// limits one process only.
type Limiter struct {
	cli    *clientv3.Client
	keys   keyspace.Space
	name   string
	logger *slog.Logger
	now    func() time.Time // refills the bucket

	mu      sync.Mutex
	rate    Rate
	local   int64 // tokens held; negative: a debt
	cached  bucketState
	cacheMR int64 // mod revision of cached; 0: not read yet
	changed chan struct{}
	closed  bool
	fetch   sync.Mutex // one batch fetch at a time

	stop context.CancelFunc
	done chan struct{}
}

// LimiterOption changes a Limiter.
type LimiterOption func(*Limiter)

// WithLimiterLogger sets where a Limiter logs configuration changes.
func WithLimiterLogger(l *slog.Logger) LimiterOption { return func(lim *Limiter) { lim.logger = l } }

// NewLimiter returns a handle on rate limit name. When def is not nil and the
// limit has no configuration yet, def becomes its configuration (the first
// worker to start creates it; later ones, and `drover limits set`, change
// it). Without def, a limit nobody configured is ErrNoLimit.
func NewLimiter(ctx context.Context, cli *clientv3.Client, ns, name string, def *Rate, opts ...LimiterOption) (*Limiter, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	if err := keyspace.CheckName("limit name", name); err != nil {
		return nil, err
	}
	l := &Limiter{cli: cli, keys: keys, name: name, logger: slog.Default(), now: time.Now, changed: make(chan struct{}), done: make(chan struct{})}
	for _, opt := range opts {
		opt(l)
	}
	if def != nil {
		if err := seedConfig(ctx, cli, l.logger, keys.LimitConfig(name), "limit", name, "drover limits set "+name+" RATE [--burst N]", def); err != nil {
			return nil, err
		}
	}
	rate, rev, err := GetRate(ctx, cli, ns, name)
	if err != nil {
		return nil, err
	}
	l.rate = rate
	// The limit's series exist from the start, at 0.
	metrics.RateLimitWaits.WithLabelValues(name)
	metrics.RateLimitWaitSeconds.WithLabelValues(name)
	metrics.RateLimitTokensUsed.WithLabelValues(name)
	wctx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	go l.follow(wctx, rev)
	return l, nil
}

// GetRate reads rate limit name's configuration and the revision it was
// read at.
func GetRate(ctx context.Context, cli *clientv3.Client, ns, name string) (Rate, int64, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return Rate{}, 0, err
	}
	g, err := cli.Get(ctx, keys.LimitConfig(name))
	if err != nil {
		return Rate{}, 0, fmt.Errorf("flow: read limit %s: %w", name, err)
	}
	if len(g.Kvs) == 0 {
		return Rate{}, 0, fmt.Errorf("%w: %s (set it with `drover limits set %s RATE`)", ErrNoLimit, name, name)
	}
	var r Rate
	if err := json.Unmarshal(g.Kvs[0].Value, &r); err != nil {
		return Rate{}, 0, fmt.Errorf("flow: limit %s has an unreadable configuration: %w", name, err)
	}
	return r, g.Header.Revision, nil
}

// follow applies configuration changes as etcd reports them.
func (l *Limiter) follow(ctx context.Context, rev int64) {
	defer close(l.done)
	followKey(ctx, l.cli, l.keys.LimitConfig(l.name), rev, func(kv *mvccpb.KeyValue, _ int64) {
		var r Rate
		if kv != nil && json.Unmarshal(kv.Value, &r) == nil { // deleted: keep the last rate
			l.setRate(r)
		}
	})
}

// followKey calls apply with each change of key after rev, until ctx ends:
// the key as written, or nil when it was deleted, and the revision of the
// change. A watch that breaks (compaction) is replaced after reading the key
// again, and apply gets what the read found, at the read's revision.
func followKey(ctx context.Context, cli *clientv3.Client, key string, rev int64, apply func(kv *mvccpb.KeyValue, at int64)) {
	for ctx.Err() == nil {
		for resp := range cli.Watch(ctx, key, clientv3.WithRev(rev+1)) {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				rev = ev.Kv.ModRevision
				if ev.Type == clientv3.EventTypePut {
					apply(ev.Kv, rev)
				} else {
					apply(nil, rev)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		if g, err := cli.Get(ctx, key); err == nil {
			rev = g.Header.Revision
			if len(g.Kvs) == 1 {
				apply(g.Kvs[0], rev)
			} else {
				apply(nil, rev)
			}
		}
	}
}

func (l *Limiter) setRate(r Rate) {
	l.mu.Lock()
	old := l.rate
	l.rate = r
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	if old != r {
		l.logger.Info("rate limit changed", "limit", l.name, "rate", r.String(), "burst", r.Burst)
	}
}

// Name returns the limit's name.
func (l *Limiter) Name() string { return l.name }

// Rate returns the limit's current configuration.
func (l *Limiter) Rate() Rate {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rate
}

// Reservation is n tokens taken by Reserve, to be settled with what was used.
type Reservation struct {
	l       *Limiter
	n       int64
	settled sync.Once
}

// Reserve waits until n tokens are available to this process and takes
// them. It fails when ctx ends, when n exceeds the limit's burst
// (ErrExceedsBurst), or when etcd cannot be reached.
func (l *Limiter) Reserve(ctx context.Context, n int64) (*Reservation, error) {
	if n < 0 {
		return nil, fmt.Errorf("flow: reserve %d tokens of %s: must not be negative", n, l.name)
	}
	var waited time.Duration
	defer func() {
		if waited > 0 {
			metrics.RateLimitWaits.WithLabelValues(l.name).Inc()
			metrics.RateLimitWaitSeconds.WithLabelValues(l.name).Add(waited.Seconds())
		}
	}()
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, fmt.Errorf("flow: limit %s: limiter closed", l.name)
		}
		if l.local >= n {
			l.local -= n
			l.mu.Unlock()
			return &Reservation{l: l, n: n}, nil
		}
		rate, changed := l.rate, l.changed
		// A debt can make the shortfall larger than the bucket ever
		// holds: take it a bucketful at a time.
		need := min(n-l.local, rate.Burst)
		l.mu.Unlock()
		if n > rate.Burst {
			return nil, fmt.Errorf("%w: %d tokens of %s, burst %d", ErrExceedsBurst, n, l.name, rate.Burst)
		}
		// At most half the burst at once: the bucket keeps filling while a
		// batch is in flight instead of spilling over its cap.
		batch := min(max(need, int64(rate.PerSecond()*batchWindow.Seconds())), max(need, rate.Burst/2))
		// One batch fetch at a time per process: concurrent reservations
		// share what it brings instead of each taking a batch.
		l.fetch.Lock()
		l.mu.Lock()
		enough := l.local >= n
		l.mu.Unlock()
		if enough {
			l.fetch.Unlock()
			continue
		}
		got, wait, err := l.take(ctx, rate, batch)
		if err == nil && got > 0 {
			l.mu.Lock()
			closed := l.closed
			if !closed {
				l.local += got
			}
			l.mu.Unlock()
			if closed { // Close ran meanwhile: these go back
				_ = l.give(context.WithoutCancel(ctx), got)
			}
		}
		l.fetch.Unlock()
		if err != nil {
			return nil, err
		}
		if got > 0 {
			continue
		}
		began := time.Now()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		case <-changed:
		case <-t.C:
		}
		t.Stop()
		waited += time.Since(began)
	}
}

// Settle records that the reservation used actual tokens: fewer gives the
// rest back to this process, more takes the difference (as a debt paid by
// later reservations). Only the first call counts.
func (r *Reservation) Settle(actual int64) {
	r.settled.Do(func() {
		actual = max(actual, 0)
		r.l.mu.Lock()
		closed := r.l.closed
		if !closed {
			r.l.local += r.n - actual
		}
		r.l.mu.Unlock()
		if closed && r.n != actual { // settled after Close: straight to the bucket
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = r.l.give(ctx, r.n-actual)
			cancel()
		}
		metrics.RateLimitTokensUsed.WithLabelValues(r.l.name).Add(float64(actual))
	})
}

// take takes batch tokens from the shared bucket if it holds that many;
// otherwise it takes nothing and says how long until it may. Waiting for a
// whole batch (a tenth of a second's tokens) keeps the bucket's writes to
// one per batch however many processes share it. One transaction, retried
// on a conflicting write.
func (l *Limiter) take(ctx context.Context, rate Rate, batch int64) (int64, time.Duration, error) {
	need := batch
	for {
		l.mu.Lock()
		st, mr := l.cached, l.cacheMR
		l.mu.Unlock()
		if mr == 0 {
			var err error
			if st, mr, err = l.read(ctx); err != nil {
				return 0, 0, err
			}
		}
		st = st.refill(rate, l.now())
		if st.Tokens < float64(need) {
			l.cache(st, mr)
			missing := float64(need) - st.Tokens
			return 0, time.Duration(math.Ceil(missing/rate.PerSecond()*1e9)) + time.Millisecond, nil
		}
		k := batch
		st.Tokens -= float64(k)
		st.Used += k
		ok, fresh, freshMR, err := l.cas(ctx, mr, st)
		if err != nil {
			return 0, 0, err
		}
		if ok {
			return k, 0, nil
		}
		l.cache(fresh, freshMR)
	}
}

// give returns n tokens (negative: takes a debt) to the shared bucket.
func (l *Limiter) give(ctx context.Context, n int64) error {
	for {
		l.mu.Lock()
		st, mr, rate := l.cached, l.cacheMR, l.rate
		l.mu.Unlock()
		if mr == 0 {
			var err error
			if st, mr, err = l.read(ctx); err != nil {
				return err
			}
		}
		st = st.refill(rate, l.now())
		st.Tokens = math.Min(float64(rate.Burst), st.Tokens+float64(n))
		st.Used -= n
		ok, fresh, freshMR, err := l.cas(ctx, mr, st)
		if err != nil || ok {
			return err
		}
		l.cache(fresh, freshMR)
	}
}

func (l *Limiter) cache(st bucketState, mr int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cached, l.cacheMR = st, mr
}

// read returns the bucket and its mod revision (-1: no bucket yet).
func (l *Limiter) read(ctx context.Context) (bucketState, int64, error) {
	g, err := l.cli.Get(ctx, l.keys.LimitState(l.name))
	if err != nil {
		return bucketState{}, 0, fmt.Errorf("flow: read limit %s: %w", l.name, err)
	}
	if len(g.Kvs) == 0 {
		return bucketState{}, -1, nil
	}
	var st bucketState
	_ = json.Unmarshal(g.Kvs[0].Value, &st)
	return st, g.Kvs[0].ModRevision, nil
}

// cas writes st if the bucket is still at mod revision mr (-1: absent);
// otherwise it returns the bucket as it is.
func (l *Limiter) cas(ctx context.Context, mr int64, st bucketState) (bool, bucketState, int64, error) {
	key := l.keys.LimitState(l.name)
	b, _ := json.Marshal(st)
	cmpRev := max(mr, 0)
	began := time.Now()
	resp, err := l.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", cmpRev)).
		Then(clientv3.OpPut(key, string(b))).
		Else(clientv3.OpGet(key)).
		Commit()
	metrics.ObserveTxn("ratelimit", began)
	if err != nil {
		return false, bucketState{}, 0, fmt.Errorf("flow: update limit %s: %w", l.name, err)
	}
	if resp.Succeeded {
		l.cache(st, resp.Header.Revision)
		return true, st, resp.Header.Revision, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return false, bucketState{}, -1, nil
	}
	var fresh bucketState
	_ = json.Unmarshal(kvs[0].Value, &fresh)
	return false, fresh, kvs[0].ModRevision, nil
}

// Close gives back the tokens this process holds (or pays its debt), so that
// the bucket's usage counts exactly what was settled, and stops following
// the configuration.
func (l *Limiter) Close(ctx context.Context) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	held := l.local
	l.local = 0
	l.mu.Unlock()
	l.stop()
	<-l.done
	if held == 0 {
		return nil
	}
	return l.give(ctx, held)
}

// seedConfig writes the configuration def of a limit, quota or breaker
// (kind) at key if it has none: one set in etcd wins over a process's flag.
// When etcd's differs from def, it says so on logger, with the command that
// changes it (change), so that a flag is never ignored without a word.
func seedConfig(ctx context.Context, cli *clientv3.Client, logger *slog.Logger, key, kind, name, change string, def any) error {
	b, err := json.Marshal(def)
	if err != nil {
		return fmt.Errorf("flow: encode %s %s: %w", kind, name, err)
	}
	_, err = kv.Create(ctx, cli, key, b, 0)
	var exists *kv.ExistsError
	switch {
	case errors.As(err, &exists):
		if !sameJSON(exists.Value, b) {
			logger.Warn(fmt.Sprintf("%s %s is already configured in etcd, differently: etcd's setting wins over the one given here", kind, name),
				kind, name, "given", string(b), "in_etcd", string(exists.Value), "change_with", change)
		}
	case err != nil:
		return fmt.Errorf("flow: configure %s %s: %w", kind, name, err)
	}
	return nil
}

// sameJSON reports whether a and b hold the same JSON value.
func sameJSON(a, b []byte) bool {
	var va, vb any
	return json.Unmarshal(a, &va) == nil && json.Unmarshal(b, &vb) == nil && reflect.DeepEqual(va, vb)
}

// LimitUsage is a rate limit with its bucket as it stands now.
type LimitUsage struct {
	Name      string  `json:"name"`
	Rate      string  `json:"rate"`
	PerSecond float64 `json:"per_second"`
	Burst     int64   `json:"burst"`
	// Available is the tokens in the bucket now (refilled to this moment;
	// negative while tasks that used more than they reserved are paid
	// back).
	Available float64 `json:"available"`
	// Used is the tokens taken out and not given back, in total.
	Used int64 `json:"used"`
}

// usageOf reads limit name's configuration and bucket state (state may be
// nil: a bucket nobody took from yet is full).
func usageOf(name string, config, state []byte, now time.Time) (LimitUsage, error) {
	var r Rate
	if err := json.Unmarshal(config, &r); err != nil {
		return LimitUsage{}, fmt.Errorf("flow: limit %s has an unreadable configuration: %w", name, err)
	}
	var st bucketState
	if state != nil {
		_ = json.Unmarshal(state, &st)
	}
	st = st.refill(r, now)
	return LimitUsage{Name: name, Rate: r.String(), PerSecond: r.PerSecond(), Burst: r.Burst, Available: st.Tokens, Used: st.Used}, nil
}

// Usage reads a limit's bucket, its configuration and state in one read:
// tokens now (refilled to this moment) and tokens used in total.
func Usage(ctx context.Context, cli *clientv3.Client, ns, name string) (tokens float64, used int64, err error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return 0, 0, err
	}
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(keys.LimitConfig(name)), clientv3.OpGet(keys.LimitState(name))).Commit()
	if err != nil {
		return 0, 0, fmt.Errorf("flow: read limit %s: %w", name, err)
	}
	cfg, st := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(cfg) == 0 {
		return 0, 0, fmt.Errorf("%w: %s (set it with `drover limits set %s RATE`)", ErrNoLimit, name, name)
	}
	var state []byte
	if len(st) > 0 {
		state = st[0].Value
	}
	u, err := usageOf(name, cfg[0].Value, state, time.Now())
	return u.Available, u.Used, err
}

// Limits lists every rate limit of the namespace by name, with its bucket
// as it stands now, from one read of the limits' keys.
func Limits(ctx context.Context, cli *clientv3.Client, ns string) ([]LimitUsage, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	g, err := cli.Get(ctx, keys.Limits(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("flow: list rate limits: %w", err)
	}
	configs, states := map[string][]byte{}, map[string][]byte{}
	var names []string
	for _, kv := range g.Kvs {
		name, part, _ := keyspace.SplitName(keys.Limits(), string(kv.Key))
		if part == keyspace.ConfigPart {
			configs[name] = kv.Value
			names = append(names, name)
		} else if part == keyspace.StatePart {
			states[name] = kv.Value
		}
	}
	slices.Sort(names)
	now := time.Now()
	out := make([]LimitUsage, 0, len(names))
	for _, name := range names {
		u, err := usageOf(name, configs[name], states[name], now)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// SetRate writes rate limit name's configuration; every Limiter of it
// follows within a moment. The bucket keeps its tokens (capped by the new
// burst at the next refill).
func SetRate(ctx context.Context, cli *clientv3.Client, ns, name string, r Rate) error {
	keys, err := keyspace.New(ns)
	if err != nil {
		return err
	}
	if err := keyspace.CheckName("limit name", name); err != nil {
		return err
	}
	if err := CheckBurst("burst", r.Burst); err != nil {
		return err
	}
	b, _ := json.Marshal(r)
	if _, err := cli.Put(ctx, keys.LimitConfig(name), string(b)); err != nil {
		return fmt.Errorf("flow: set limit %s: %w", name, err)
	}
	return nil
}
