package flow

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Breaker states.
const (
	Closed   = "closed"
	Open     = "open"
	HalfOpen = "half-open"
)

// BreakerConfig is when a breaker opens and how long it stays open.
type BreakerConfig struct {
	// Failures is how many consecutive failures open the breaker.
	Failures int `json:"failures"`
	// Cooldown is how long it stays open before one probe is let through.
	Cooldown time.Duration `json:"cooldown"`
	// Ratio, when above 0, also opens the breaker when at least Ratio of
	// the calls in a Window failed, once the window holds MinCalls calls.
	Ratio    float64       `json:"ratio,omitempty"`
	Window   time.Duration `json:"window,omitempty"`
	MinCalls int64         `json:"min_calls,omitempty"`
}

// DefaultBreaker is the configuration a breaker gets when none is given.
var DefaultBreaker = BreakerConfig{Failures: 5, Cooldown: 30 * time.Second}

// Check returns an InputError for the first field out of range.
func (c BreakerConfig) Check(field string) error {
	if c.Failures < 1 || c.Failures > 1e6 {
		return &drover.InputError{Field: field + " failures", Value: c.Failures, Rule: "must be between 1 and 1000000"}
	}
	if err := drover.CheckDuration(field+" cooldown", c.Cooldown, 100*time.Millisecond, 24*time.Hour); err != nil {
		return err
	}
	if c.Ratio == 0 {
		return nil
	}
	if !(c.Ratio >= 0 && c.Ratio <= 1) { // NaN too
		return &drover.InputError{Field: field + " ratio", Value: c.Ratio, Rule: "must be between 0 (off) and 1"}
	}
	if c.MinCalls < 1 || c.MinCalls > 1e9 {
		return &drover.InputError{Field: field + " min-calls", Value: c.MinCalls, Rule: "must be between 1 and 1e9 with a ratio"}
	}
	return drover.CheckDuration(field+" window", c.Window, time.Second, 24*time.Hour)
}

// flushEvery is how often a worker adds its calls to the window's counts.
func (c BreakerConfig) flushEvery() time.Duration { return min(c.Window/10, time.Second) }

// BreakerState is a breaker's shared state.
type BreakerState struct {
	State string `json:"state"`
	// Consecutive counts failures since the last success.
	Consecutive int `json:"consecutive"`
	// Since is when the breaker entered its state.
	Since time.Time `json:"since"`
	// Probe is the task let through while half-open.
	Probe string `json:"probe,omitempty"`
	// Opened counts how many times the breaker opened.
	Opened int64 `json:"opened"`
	// WindowStart, Calls and Fails count the fleet's calls in the current
	// window (ratio mode).
	WindowStart time.Time `json:"window_start,omitzero"`
	Calls       int64     `json:"calls,omitempty"`
	Fails       int64     `json:"fails,omitempty"`
}

// Breaker is one process's handle on a circuit breaker shared by the fleet.
// Its state lives in etcd and every worker follows it by watch, so when one
// worker's failures open it, every worker holds off within moments.
//
//   - closed: tasks run; each failure counts, a success resets the count;
//     Failures consecutive failures open it.
//   - open: tasks that need the resource are deferred until the cooldown
//     ends (not failed, not charged a retry).
//   - half-open: after the cooldown one task (the probe) is let through, won
//     by compare-and-swap so that only one worker sends it; its success
//     closes the breaker, its failure opens it again. A probe that never
//     reports (its worker died) is replaced after another cooldown.
//
// Transitions are compare-and-swap transactions on the state key. A success
// while closed with no failures counted writes nothing.
type Breaker struct {
	cli    *clientv3.Client
	keys   keyspace.Space
	name   string
	types  []string
	logger *slog.Logger
	now    func() time.Time
	// openReason is the reason of the breaker's deferrals.
	openReason string

	mu    sync.Mutex
	cfg   BreakerConfig
	state BreakerState
	mod   int64 // mod revision of state; 0: absent
	seen  int64 // revision at which state was seen

	// ratio mode: this process's calls not yet added to the window
	calls, fails int64
	flushed      time.Time

	stop context.CancelFunc
	done chan struct{}
}

// NewBreaker returns a handle on breaker name. def, when not nil, configures
// it if nobody has (etcd's configuration wins otherwise). types, when given,
// limits it to tasks of those types.
func NewBreaker(ctx context.Context, cli *clientv3.Client, ns, name string, def *BreakerConfig, types ...string) (*Breaker, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	if err := keyspace.CheckName("breaker name", name); err != nil {
		return nil, err
	}
	if def != nil {
		if err := def.Check("breaker"); err != nil {
			return nil, err
		}
		if err := seedConfig(ctx, cli, slog.Default(), keys.BreakerConfig(name), "breaker", name, "drover breakers set "+name+" [--failures N] [--cooldown D] ...", def); err != nil {
			return nil, err
		}
	}
	br := newBreaker(cli, keys, name, types)
	br.done = make(chan struct{})
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(keys.BreakerConfig(name)), clientv3.OpGet(keys.BreakerState(name))).Commit()
	if err != nil {
		return nil, fmt.Errorf("flow: read breaker %s: %w", name, err)
	}
	cfgKV := resp.Responses[0].GetResponseRange().Kvs
	if len(cfgKV) == 0 {
		return nil, fmt.Errorf("flow: breaker %s is not configured (start a worker with --breaker %s)", name, name)
	}
	if err := json.Unmarshal(cfgKV[0].Value, &br.cfg); err != nil {
		return nil, fmt.Errorf("flow: breaker %s has an unreadable configuration: %w", name, err)
	}
	br.state = BreakerState{State: Closed}
	if st := resp.Responses[1].GetResponseRange().Kvs; len(st) == 1 {
		_ = json.Unmarshal(st[0].Value, &br.state)
		br.mod = st[0].ModRevision
	}
	br.seen = resp.Header.Revision
	br.publish()
	wctx, cancel := context.WithCancel(context.Background())
	br.stop = cancel
	rev := resp.Header.Revision
	go func() {
		defer close(br.done)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			followKey(wctx, cli, keys.BreakerConfig(name), rev, func(kv *mvccpb.KeyValue, _ int64) {
				var c BreakerConfig
				if kv != nil && json.Unmarshal(kv.Value, &c) == nil && c.Check("breaker") == nil {
					br.mu.Lock()
					br.cfg = c
					br.mu.Unlock()
				}
			})
		}()
		followKey(wctx, cli, keys.BreakerState(name), rev, br.observe)
		wg.Wait()
	}()
	return br, nil
}

// newBreaker returns a Breaker with its fixed fields set.
func newBreaker(cli *clientv3.Client, keys keyspace.Space, name string, types []string) *Breaker {
	return &Breaker{cli: cli, keys: keys, name: name, types: types, logger: slog.Default(), now: time.Now,
		openReason: "breaker " + name + " open"}
}

// observe records a change of the state key seen by watch or read (kv nil:
// deleted, which is closed).
func (b *Breaker) observe(kv *mvccpb.KeyValue, at int64) {
	if kv == nil {
		b.set(BreakerState{State: Closed}, 0, at)
		return
	}
	var st BreakerState
	if json.Unmarshal(kv.Value, &st) == nil {
		b.set(st, kv.ModRevision, at)
	}
}

// set records a state seen at revision at (mod: the key's mod revision, 0
// when absent) unless a later one is held.
func (b *Breaker) set(st BreakerState, mod, at int64) {
	b.mu.Lock()
	if at < b.seen {
		b.mu.Unlock()
		return
	}
	old := b.state.State
	b.state, b.mod, b.seen = st, mod, at
	b.mu.Unlock()
	b.publish()
	if old != st.State {
		b.logger.Info("circuit breaker changed", "breaker", b.name, "from", old, "to", st.State, "consecutive_failures", st.Consecutive)
	}
}

func (b *Breaker) publish() {
	b.mu.Lock()
	s := b.state.State
	b.mu.Unlock()
	v := map[string]float64{Closed: 0, HalfOpen: 1, Open: 2}[s]
	metrics.BreakerState.WithLabelValues(b.name).Set(v)
}

// State returns the breaker's state as this process last saw it.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// update applies change to the state by compare-and-swap, retrying on a
// conflicting write. change returns false to write nothing.
func (b *Breaker) update(ctx context.Context, change func(st *BreakerState, cfg BreakerConfig) bool) (BreakerState, bool, error) {
	key := b.keys.BreakerState(b.name)
	for {
		b.mu.Lock()
		st, mod, cfg := b.state, b.mod, b.cfg
		b.mu.Unlock()
		if !change(&st, cfg) {
			return st, false, nil
		}
		v, _ := json.Marshal(st)
		began := time.Now()
		resp, err := b.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).
			Then(clientv3.OpPut(key, string(v))).Else(clientv3.OpGet(key)).Commit()
		metrics.ObserveTxn("breaker", began)
		if err != nil {
			return st, false, fmt.Errorf("flow: breaker %s: %w", b.name, err)
		}
		if resp.Succeeded {
			b.set(st, resp.Header.Revision, resp.Header.Revision)
			return st, true, nil
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			var fresh BreakerState
			_ = json.Unmarshal(kvs[0].Value, &fresh)
			b.set(fresh, kvs[0].ModRevision, resp.Header.Revision)
		} else {
			b.set(BreakerState{State: Closed}, 0, resp.Header.Revision)
		}
	}
}

// Allow says whether task id may call the resource now: nil, or a
// *DeferError saying for how long to hold it off. While open past the
// cooldown, the first caller becomes the half-open probe.
func (b *Breaker) Allow(ctx context.Context, id string) error {
	st := b.State()
	cfg := b.config()
	now := b.now()
	switch {
	case st.State == Closed:
		return nil
	case st.State == Open && now.Sub(st.Since) < cfg.Cooldown:
		return b.deferFor(cfg.Cooldown - now.Sub(st.Since))
	case st.State == HalfOpen && now.Sub(st.Since) < cfg.Cooldown:
		return b.deferFor(cfg.Cooldown / 4)
	}
	// Open past the cooldown, or a half-open probe that never reported:
	// try to become the probe.
	_, won, err := b.update(ctx, func(s *BreakerState, c BreakerConfig) bool {
		now := b.now()
		if s.State == Closed || now.Sub(s.Since) < c.Cooldown {
			return false
		}
		s.State, s.Since, s.Probe = HalfOpen, now.UTC(), id
		return true
	})
	if err != nil {
		return err
	}
	if won || b.State().State == Closed {
		return nil
	}
	return b.deferFor(cfg.Cooldown / 4)
}

func (b *Breaker) config() BreakerConfig {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg
}

func (b *Breaker) deferFor(d time.Duration) error {
	d = max(d, 50*time.Millisecond)
	d += rand.N(d/10 + 1) // spread the fleet's returns
	return &DeferError{Reason: b.openReason, After: d}
}

// Record reports how a call by task id went: a success closes a half-open
// breaker and resets the failure count, a failure counts and opens the
// breaker at the configured number (a failed probe opens it again). With a
// ratio, calls are also counted locally and added to the fleet's window
// counts at most every tenth of the window (one write per worker), and the
// breaker opens when the window's failure ratio reaches it.
func (b *Breaker) Record(ctx context.Context, id string, failed bool) error {
	cfg := b.config()
	flush := false
	var calls, fails int64
	if cfg.Ratio > 0 {
		b.mu.Lock()
		b.calls++
		if failed {
			b.fails++
		}
		if now := b.now(); now.Sub(b.flushed) >= cfg.flushEvery() {
			flush, calls, fails = true, b.calls, b.fails
			b.calls, b.fails, b.flushed = 0, 0, now
		}
		b.mu.Unlock()
	}
	_, _, err := b.update(ctx, func(s *BreakerState, c BreakerConfig) bool {
		now := b.now().UTC()
		changed := false
		if flush {
			if now.Sub(s.WindowStart) > c.Window {
				s.WindowStart, s.Calls, s.Fails = now, 0, 0
			}
			s.Calls += calls
			s.Fails += fails
			changed = true
			if s.State == Closed && c.Ratio > 0 && s.Calls >= c.MinCalls && float64(s.Fails) >= c.Ratio*float64(s.Calls) {
				s.State, s.Since = Open, now
				s.Opened++
				s.WindowStart, s.Calls, s.Fails = now, 0, 0
				return true
			}
		}
		if !failed {
			if s.State == Closed && s.Consecutive == 0 {
				return changed
			}
			if s.State == Open || s.State == HalfOpen && s.Probe != id {
				// A call let through before the breaker opened: its
				// success does not close it; the probe decides.
				return changed
			}
			if s.State == Closed { // a success ends the run of failures
				s.Consecutive = 0
				return true
			}
			// The probe succeeded: closed, with a fresh window.
			*s = BreakerState{State: Closed, Since: now, Opened: s.Opened, WindowStart: now}
			return true
		}
		s.Consecutive++
		switch {
		case s.State == HalfOpen && s.Probe == id:
			s.State, s.Since, s.Probe = Open, now, ""
			s.Opened++
		case s.State == Closed && s.Consecutive >= c.Failures:
			s.State, s.Since = Open, now
			s.Opened++
		}
		return true
	})
	if err != nil && flush { // the counts go in with the next flush
		b.mu.Lock()
		b.calls += calls
		b.fails += fails
		b.mu.Unlock()
	}
	return err
}

// Reset closes the breaker and clears its count.
func (b *Breaker) Reset(ctx context.Context) error {
	_, _, err := b.update(ctx, func(s *BreakerState, _ BreakerConfig) bool {
		*s = BreakerState{State: Closed, Since: b.now().UTC(), Opened: s.Opened}
		return true
	})
	return err
}

// Close stops following the breaker, waiting no longer than ctx allows. It
// is safe to call more than once.
func (b *Breaker) Close(ctx context.Context) error {
	b.stop()
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flow: close breaker %s: %w", b.name, ctx.Err())
	}
}

// BreakerGate holds calls of the breaker's types off while it is open
// (deferred: a queued task is not charged a retry) and records each call's
// outcome: Succeeded and Failed count (timeouts are failures), Inconclusive
// (a permanent failure is the input's own fault; a cancelled call did not
// finish) and NotRun do not.
func BreakerGate(b *Breaker) Gate { return breakerGate{b} }

type breakerGate struct{ b *Breaker }

func (g breakerGate) Admit(ctx context.Context, c Call) (func(error), error) {
	if len(g.b.types) > 0 && !slices.Contains(g.b.types, c.Type) {
		return nil, nil
	}
	if err := g.b.Allow(ctx, c.ID); err != nil {
		return nil, err
	}
	id, outcome := c.ID, c.outcomes()
	return func(err error) {
		o := outcome(err)
		if o != Succeeded && o != Failed {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := g.b.Record(rctx, id, o == Failed); rerr != nil {
			g.b.logger.Warn("flow: could not record a call's result in its breaker", "breaker", g.b.name, "err", rerr)
		}
	}, nil
}

// BreakerStatus is one breaker as `drover breakers list` shows it.
type BreakerStatus struct {
	Name   string        `json:"name"`
	Config BreakerConfig `json:"config"`
	BreakerState
}

// Breakers lists every configured breaker with its state.
func Breakers(ctx context.Context, cli *clientv3.Client, ns string) ([]BreakerStatus, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	g, err := cli.Get(ctx, keys.Breakers(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("flow: list breakers: %w", err)
	}
	byName := map[string]*BreakerStatus{}
	var names []string
	for _, kv := range g.Kvs {
		name, part, _ := keyspace.SplitName(keys.Breakers(), string(kv.Key))
		s := byName[name]
		if s == nil {
			s = &BreakerStatus{Name: name, BreakerState: BreakerState{State: Closed}}
			byName[name] = s
			names = append(names, name)
		}
		switch part {
		case keyspace.ConfigPart:
			_ = json.Unmarshal(kv.Value, &s.Config)
		case keyspace.StatePart:
			_ = json.Unmarshal(kv.Value, &s.BreakerState)
		}
	}
	slices.Sort(names)
	out := make([]BreakerStatus, 0, len(names))
	for _, n := range names {
		out = append(out, *byName[n])
	}
	return out, nil
}

// ResetBreaker closes breaker name for the whole fleet.
func ResetBreaker(ctx context.Context, cli *clientv3.Client, ns, name string) error {
	b, err := NewBreaker(ctx, cli, ns, name, nil)
	if err != nil {
		return err
	}
	defer func() { _ = b.Close(context.WithoutCancel(ctx)) }()
	return b.Reset(ctx)
}
