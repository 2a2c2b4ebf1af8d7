package fleet_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// gateClock is a clock with timers, moved by hand: Add fires the timers
// whose time came (unless fire is off), in the caller's goroutine.
type gateClock struct {
	mu     sync.Mutex
	now    time.Time
	fire   bool
	timers []gateTimer
}

type gateTimer struct {
	at time.Time
	f  func()
}

func (c *gateClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *gateClock) AfterFunc(d time.Duration, f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timers = append(c.timers, gateTimer{at: c.now.Add(d), f: f})
}

func (c *gateClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if c.fire && !tm.at.After(c.now) {
			due = append(due, tm.f)
		} else {
			kept = append(kept, tm)
		}
	}
	c.timers = kept
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// blockGate is a budget gate on a budget of ample room (window seconds)
// whose client and gate read clk.
type blockGate struct {
	t    *testing.T
	b    *budget.Client
	gate *fleet.BudgetGate
	key  string
	n    int
}

func newBlockGate(t *testing.T, clk *gateClock, key string, window int64) *blockGate {
	t.Helper()
	ctx := context.Background()
	cli := srv.Client(t)
	b := budget.New(cli, etcdtest.Namespace(t), budget.WithClock(clk.Now))
	t.Cleanup(func() { b.Close() })
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 1_000_000, Requests: 100_000, WindowSeconds: window}); err != nil {
		t.Fatal(err)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Revoke(context.Background(), l.ID) })
	gate := fleet.NewBudgetGate(b, func() clientv3.LeaseID { return l.ID }, nil)
	fleet.SetClock(gate, clk.Now, clk.AfterFunc)
	return &blockGate{t: t, b: b, gate: gate, key: key}
}

// run admits one task of 10 estimated tokens, reports 7 used, ends it,
// waits for what the gate does in the background, and returns the
// reservations the gate made meanwhile (0: from a block, none taken).
func (g *blockGate) run() float64 {
	g.t.Helper()
	g.n++
	task := &queue.Task{ID: fmt.Sprintf("t%03d", g.n), Type: "chat", Metadata: queue.Metadata{Tenant: "acme", Budget: g.key, EstimatedTokens: 10}}
	before := testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(g.key, "admitted"))
	done, err := g.gate.Admit(context.Background(), task)
	if err != nil {
		g.t.Fatal(err)
	}
	g.gate.Used(task, 7)
	done(nil)
	g.wait()
	return testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(g.key, "admitted")) - before
}

func (g *blockGate) wait() {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := fleet.WaitBackground(ctx, g.gate); err != nil {
		g.t.Fatal(err)
	}
}

func (g *blockGate) usage() budget.Usage {
	g.t.Helper()
	u, err := g.b.Get(context.Background(), g.key)
	if err != nil {
		g.t.Fatal(err)
	}
	return u
}

// openBlock runs the tasks that make the gate reserve a block (the first
// learns the room, the second takes the block) and one admitted from it;
// it checks the block is the one reservation left.
func (g *blockGate) openBlock() {
	g.t.Helper()
	g.run()
	g.run()
	if made := g.run(); made != 0 {
		g.t.Fatalf("third task: %v reservations of its own, want 0 (from the block)", made)
	}
	if u := g.usage(); u.Live != 1 {
		g.t.Fatalf("with a block open: %d live reservations, want 1", u.Live)
	}
}

// TestBudgetBlockClosesAfterMaxAge: a block admits tasks for one second
// of the gate's clock; then it closes and is settled, with no task to
// prompt it: the tokens its task used are counted and its unused
// requests given back.
func TestBudgetBlockClosesAfterMaxAge(t *testing.T) {
	t.Parallel()
	clk := &gateClock{now: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), fire: true}
	g := newBlockGate(t, clk, "openai/gpt-4.1/key-block-age", 86400)
	g.openBlock()
	clk.Add(999 * time.Millisecond)
	g.wait()
	if u := g.usage(); u.Live != 1 || u.Used != 14 {
		t.Fatalf("999 ms after the block: live %d, used %d; want 1 (the block, open), 14 (the two lone tasks)", u.Live, u.Used)
	}
	clk.Add(time.Millisecond)
	g.wait()
	if u := g.usage(); u.Live != 0 || u.Used != 21 || u.RequestsUsed != 3 || u.Reserved != 0 {
		t.Fatalf("a second after the block: live %d, used %d, requests %d, reserved %d; want 0, 21, 3, 0 (settled, unused requests back)", u.Live, u.Used, u.RequestsUsed, u.Reserved)
	}
}

// TestBudgetBlockClosesAtWindowEnd: a block reserved half a second before
// its window ends closes then, not a second later; and a task that comes
// at or after the window's end is not admitted from it even before its
// timer ran: the block is closed and settled, the task reserved alone.
func TestBudgetBlockClosesAtWindowEnd(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 2, 3, 4, 59, 500_000_000, time.UTC) // half a second before the window turns
	t.Run("timer", func(t *testing.T) {
		t.Parallel()
		clk := &gateClock{now: start, fire: true}
		g := newBlockGate(t, clk, "openai/gpt-4.1/key-block-end", 60)
		g.openBlock()
		clk.Add(499 * time.Millisecond)
		g.wait()
		if u := g.usage(); u.Live != 1 {
			t.Fatalf("1 ms before the window ends: %d live reservations, want 1 (the block, open)", u.Live)
		}
		clk.Add(time.Millisecond)
		g.wait()
		if u := g.usage(); u.Live != 0 {
			t.Fatalf("at the window's end: %d live reservations, want 0 (the block settled)", u.Live)
		}
	})
	t.Run("admit", func(t *testing.T) {
		t.Parallel()
		clk := &gateClock{now: start} // its timers never run
		g := newBlockGate(t, clk, "openai/gpt-4.1/key-block-end-admit", 60)
		g.openBlock()
		clk.Add(500 * time.Millisecond)
		if made := g.run(); made != 2 {
			t.Fatalf("a task at the window's end: %v reservations, want 2 (its own, not from the block, and the next block)", made)
		}
		if u := g.usage(); u.Live != 1 {
			t.Fatalf("after the task at the window's end: %d live reservations, want 1 (the block settled, a new one taken)", u.Live)
		}
	})
}

// TestBudgetBlockDefaultEstimateAge: on the gate's clock, tasks without
// estimated_tokens are admitted from their tenant's block with their
// type's default as a reservation of theirs found it less than a second
// ago; a changed default is used once that second is over. The tasks
// report nothing, so each settles the estimate it was admitted with: 10
// each until the default, changed to 20, is found again a second after it
// was last found.
func TestBudgetBlockDefaultEstimateAge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := &gateClock{now: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)} // timers never run: the block stays open
	g := newBlockGate(t, clk, "openai/gpt-4.1/key-block-default", 86400)
	setDefault := func(est int64) {
		if _, err := g.b.Set(ctx, budget.Budget{Key: g.key, Tokens: 1_000_000, Requests: 100_000, WindowSeconds: 86400,
			Estimates: map[string]int64{"chat": est}}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(want float64, step string) {
		t.Helper()
		g.n++
		task := &queue.Task{ID: fmt.Sprintf("t%03d", g.n), Type: "chat", Metadata: queue.Metadata{Tenant: "acme", Budget: g.key}}
		before := testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(g.key, "admitted"))
		done, err := g.gate.Admit(ctx, task)
		if err != nil {
			t.Fatal(err)
		}
		done(nil)
		g.wait()
		if made := testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(g.key, "admitted")) - before; made != want {
			t.Fatalf("%s: %v reservations, want %v", step, made, want)
		}
	}
	setDefault(10)
	run(1, "the first task (alone: finds the default and the room)")
	run(2, "the second task (alone, and the block it prompts)")
	run(0, "the third task (from the block)")
	setDefault(20)
	clk.Add(999 * time.Millisecond)
	run(0, "999 ms after the default was found (from the block, at 10)")
	clk.Add(time.Millisecond)
	run(1, "a second after the default was found (alone: finds 20)")
	run(0, "the next task (from the block, at 20)")
	if err := g.gate.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if u := g.usage(); u.Used != 10+10+10+10+20+20 || u.RequestsUsed != 6 || u.Live != 0 || u.Reserved != 0 {
		t.Fatalf("after the drain: used %d, requests %d, live %d, reserved %d; want 80, 6, 0, 0", u.Used, u.RequestsUsed, u.Live, u.Reserved)
	}
}

// TestBudgetBlockNextWaitsForTheOpenOne: the block reserved once half of
// the open one is used admits only once that one is used up, so a
// tenant's tasks take one block reserve (and one settle) per 32 tasks:
// 2 tasks alone, then 64 from two blocks, and the third block reserved
// at half of the second.
func TestBudgetBlockNextWaitsForTheOpenOne(t *testing.T) {
	t.Parallel()
	clk := &gateClock{now: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)} // timers never run
	g := newBlockGate(t, clk, "openai/gpt-4.1/key-block-next", 86400)
	var made float64
	for i := range 2 + 64 {
		made += g.run()
		if i == 2+31 {
			if u := g.usage(); u.Live != 2 {
				t.Fatalf("the first block used up: %d live reservations, want 2 (it, open, and the next)", u.Live)
			}
		}
	}
	if made != 2+3 {
		t.Fatalf("%v reservations for 66 tasks, want 5 (2 alone, 3 blocks)", made)
	}
	if err := g.gate.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if u := g.usage(); u.Used != 66*7 || u.RequestsUsed != 66 || u.Live != 0 || u.Reserved != 0 {
		t.Fatalf("after the drain: used %d, requests %d, live %d, reserved %d; want %d, 66, 0, 0", u.Used, u.RequestsUsed, u.Live, u.Reserved, 66*7)
	}
}

// TestBudgetBlockSizeFollowsDemand: while the room is ample, each block
// of a tenant's used up doubles the next (32, 32, 64, 64, 128: the next
// is reserved at half of the open one, before that one is used up); a
// block closed with most of its requests unused brings the next back to
// 32; and with room for fewer than 4×8 blocks of 64 requests, blocks stay
// at 32.
func TestBudgetBlockSizeFollowsDemand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("grows", func(t *testing.T) {
		t.Parallel()
		clk := &gateClock{now: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)} // timers never run
		g := newBlockGate(t, clk, "openai/gpt-4.1/key-block-size", 86400)
		for range 2 + 32 + 32 + 64 + 64 {
			g.run()
		}
		if u := g.usage(); u.Live != 2 || u.Reserved != (64+128)*10 {
			t.Fatalf("after 194 tasks: live %d, reserved %d; want 2, %d (a used-up block of 64 and one of 128)", u.Live, u.Reserved, (64+128)*10)
		}
		if err := g.gate.Flush(ctx); err != nil { // the block of 128 closes unused
			t.Fatal(err)
		}
		if u := g.usage(); u.Used != 194*7 || u.RequestsUsed != 194 || u.Live != 0 || u.Reserved != 0 {
			t.Fatalf("after the drain: used %d, requests %d, live %d, reserved %d; want %d, 194, 0, 0", u.Used, u.RequestsUsed, u.Live, u.Reserved, 194*7)
		}
		if made := g.run(); made != 2 {
			t.Fatalf("the task after the drain: %v reservations, want 2 (its own and a block)", made)
		}
		if u := g.usage(); u.Live != 1 || u.Reserved != 32*10 {
			t.Fatalf("after the drain: live %d, reserved %d; want 1, %d (a block of 32)", u.Live, u.Reserved, 32*10)
		}
	})
	t.Run("room", func(t *testing.T) {
		t.Parallel()
		clk := &gateClock{now: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
		g := newBlockGate(t, clk, "openai/gpt-4.1/key-block-size-room", 86400)
		if _, err := g.b.Set(ctx, budget.Budget{Key: g.key, Tokens: 1_000_000, Requests: 1500, WindowSeconds: 86400}); err != nil {
			t.Fatal(err)
		}
		for range 2 + 32 + 32 + 32 {
			g.run()
		}
		if u := g.usage(); u.Live != 2 || u.Reserved != (32+32)*10 {
			t.Fatalf("after 98 tasks, 1500 requests a window: live %d, reserved %d; want 2, %d (blocks of 32)", u.Live, u.Reserved, (32+32)*10)
		}
	})
}

// TestBudgetBlockRefusedComesBackTo32: a grown block the budget refuses
// (here by the tenant's cap, with the budget's room ample) brings the
// tenant's next block back to 32 requests, so near its cap its tasks
// still come from blocks that fit, not each reserved alone between
// refused blocks of 128.
func TestBudgetBlockRefusedComesBackTo32(t *testing.T) {
	t.Parallel()
	clk := &gateClock{now: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)} // timers never run
	g := newBlockGate(t, clk, "openai/gpt-4.1/key-block-refused", 86400)
	for range 2 + 32 + 32 + 64 + 64 { // blocks of 32, 32, 64, 64 used up; one of 128 open
		g.run()
	}
	u := g.usage()
	caps := map[string]int64{"acme": u.Used + u.Reserved + 1000} // room for blocks of 32, not of 128
	if _, err := g.b.Set(context.Background(), budget.Budget{Key: g.key, Tokens: 1_000_000, Requests: 100_000, WindowSeconds: 86400, Caps: caps}); err != nil {
		t.Fatal(err)
	}
	refused := testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(g.key, "refused"))
	var made float64
	for range 128 + 96 { // the open block of 128, then 96 more
		made += g.run()
	}
	refused = testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(g.key, "refused")) - refused
	if made > 8 || refused > 2 {
		t.Fatalf("224 tasks near the tenant's cap took %v reservations and %v refused blocks, want at most 8 and 2 (blocks of 32)", made, refused)
	}
}
