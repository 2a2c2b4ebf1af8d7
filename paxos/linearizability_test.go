package paxos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lockCaller runs one lock command somewhere in the group and returns its
// result; the same command (same ID) may be sent again after an error,
// and the group applies it once.
type lockCaller func(ctx context.Context, client int, cmd Command) (Result, error)

// workload drives concurrent clients over a few locks and records every
// completed operation: acquire, release (sometimes with a stale token),
// renew and get. TTLs are far longer than the run, so the history's model
// needs no clock. An operation that errs is retried with the same command
// ID until it answers, so every operation in the history has a known
// outcome: the span from first call to final answer covers wherever the
// group applied it.
type workload struct {
	clients, locks, ops int
	call                lockCaller
	hist                *history
	done                atomic.Int64
	retries             atomic.Int64
}

// run drives the clients until ops operations have completed, or ctx ends.
func (w *workload) run(ctx context.Context, t *testing.T) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, w.clients)
	for c := range w.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.client(ctx, c); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// client is one client's loop. It remembers what it holds, so most
// releases and renewals name a real token.
func (w *workload) client(ctx context.Context, c int) error {
	rng := rand.New(rand.NewPCG(uint64(c), 42))
	held := map[string]uint64{}
	owner := fmt.Sprintf("c%d", c)
	for seq := 0; w.done.Load() < int64(w.ops); seq++ {
		lk := "l" + strconv.Itoa(rng.IntN(w.locks))
		cmd := Command{ID: fmt.Sprintf("%s-%d", owner, seq), Lock: lk, Owner: owner, TTL: int64(time.Hour / time.Millisecond)}
		tok, mine := held[lk]
		switch r := rng.IntN(10); {
		case mine && r < 6:
			cmd.Op, cmd.Token = OpRelease, tok
		case mine && r < 8:
			cmd.Op, cmd.Token = OpRenew, tok
		case r < 2:
			cmd.Op, cmd.Token = OpRelease, 1+uint64(rng.IntN(50)) // most likely stale
		case r < 4:
			cmd.Op = OpGet
		default:
			cmd.Op = OpAcquire
		}
		res, call, ret, err := w.attempt(ctx, c, cmd)
		if err != nil {
			return fmt.Errorf("client %d: %s %s: %w", c, cmd.Op, lk, err)
		}
		w.hist.add(c, lmInput{Op: cmd.Op, Lock: lk, Owner: owner, Token: cmd.Token},
			lmOutput{Code: res.Code, Owner: res.Lock.Owner, Token: res.Lock.Token}, call, ret)
		w.done.Add(1)
		switch {
		case cmd.Op == OpAcquire && res.Code == CodeOK:
			held[lk] = res.Lock.Token
		case cmd.Op == OpRelease && res.Code == CodeOK, mine && res.Code == CodeNotHeld:
			delete(held, lk)
		}
	}
	return nil
}

// attempt sends cmd until it answers (the same ID each time), within a
// bound.
func (w *workload) attempt(ctx context.Context, c int, cmd Command) (Result, int64, int64, error) {
	call := w.hist.now()
	var last error
	for try := 0; try < 200; try++ {
		if ctx.Err() != nil {
			break
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		res, err := w.call(actx, c, cmd)
		cancel()
		if err == nil {
			return res, call, w.hist.now(), nil
		}
		last = err
		w.retries.Add(1)
		time.Sleep(time.Duration(5+try) * time.Millisecond)
	}
	return Result{}, 0, 0, fmt.Errorf("no answer after retries: %w", errors.Join(last, ctx.Err()))
}

// historyOps is how many operations a linearizability run records:
// 10,000, or DROVER_PAXOS_OPS.
func historyOps(t *testing.T) int {
	if s := os.Getenv("DROVER_PAXOS_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("DROVER_PAXOS_OPS=%q: want a positive number", s)
		}
		return n
	}
	return 10000
}

// TestLinearizableUnderFaults records at least 10,000 lock operations from
// 16 concurrent clients on 3 nodes while the network drops 10 % of
// messages, duplicates 5 % and delays (so reorders) the rest, and one node
// crashes and restarts twice; porcupine checks the history against the
// lock model with fencing: 0 violations.
func TestLinearizableUnderFaults(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.SnapshotEvery = 500 },
		MemSeed(7), MemDropRate(0.10), MemDuplicateRate(0.05), MemDelay(0, 2*time.Millisecond))
	c.startAll()
	defer c.close()

	var mu sync.RWMutex // guards c.nodes against the crash loop
	w := &workload{clients: 16, locks: 16, ops: historyOps(t), hist: newHistory()}
	w.call = func(ctx context.Context, client int, cmd Command) (Result, error) {
		mu.RLock()
		n := c.nodes[NodeID((client+int(w.retries.Load()))%3)]
		mu.RUnlock()
		if n == nil {
			return Result{}, errors.New("node down")
		}
		return n.Propose(ctx, cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	crashes := make(chan int, 1)
	go func() {
		n := 0
		defer func() { crashes <- n }()
		for _, at := range []int64{int64(w.ops) / 4, int64(w.ops) / 2} {
			for w.done.Load() < at && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
			if ctx.Err() != nil {
				return
			}
			victim := NodeID(n + 1)
			mu.Lock()
			c.stop(victim)
			mu.Unlock()
			time.Sleep(300 * time.Millisecond)
			mu.Lock()
			c.start(victim)
			mu.Unlock()
			n++
		}
	}()
	start := time.Now()
	w.run(ctx, t)
	if n := <-crashes; n != 2 {
		t.Errorf("%d crash-restarts happened, want 2", n)
	}
	st := c.net.Stats()
	t.Logf("%d operations in %s, %d retried; network: %+v", w.done.Load(), time.Since(start).Round(time.Millisecond), w.retries.Load(), st)
	w.hist.check(t, w.ops)
}
