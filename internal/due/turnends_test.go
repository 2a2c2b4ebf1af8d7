package due_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// turnKeys returns the turn keys under ns+"turns/".
func turnKeys(t *testing.T, cli *clientv3.Client, ns string) []*mvccpb.KeyValue {
	t.Helper()
	g, err := cli.Get(context.Background(), ns+"turns/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	return g.Kvs
}

// TestTurnsTakeAtMostARequestsBatches: a read of 128 batches would make
// a turn request of 128 nested transactions, which etcd refuses (a
// nested one gets 128 operations less its level's); Parallel is held to
// 127 and a backlog of 130 items, one a batch, moves with turns.
func TestTurnsTakeAtMostARequestsBatches(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	base := time.Unix(1_800_000_000, 0)
	const n = 130
	putBacklog(t, cli, ns, base, n)
	clk := &clock{t: base.Add(time.Hour)}
	ix := index(cli, ns, clk.now)
	ix.Batch, ix.Parallel, ix.Turns = 1, 128, ns+"turns/"
	if _, m, err := ix.Promote(context.Background()); err != nil || m != n {
		t.Fatalf("moved %d (%v), want %d", m, err, n)
	}
	if left := turnKeys(t, cli, ns); len(left) != 0 {
		t.Fatalf("%d turn keys left, want 0", len(left))
	}
}

// TestRunKeepsPausesShortWhileItMoves: a Run whose reads each find one
// item whose move etcd refuses beside one that moves pauses as after a
// first failure (RetryBase to twice it) while items move, and longer
// only once none does.
func TestRunKeepsPausesShortWhileItMoves(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	past := time.Now().Add(-time.Minute)
	const good = 4
	names := []string{"bad"}
	for i := range good {
		names = append(names, fmt.Sprint("good", i))
	}
	for i, name := range names { // bad first: every read finds it
		if _, err := cli.Put(ctx, due.Key(ns+"due/", past.Add(time.Duration(i)*time.Millisecond), name), "v"); err != nil {
			t.Fatal(err)
		}
	}
	pre := ns + "due/"
	ix := &due.Index{Client: cli, Prefix: pre, Name: "test-progress", Turns: ns + "turns/", Batch: 1, Parallel: 2,
		Move: func(kv *mvccpb.KeyValue) ([]clientv3.Op, bool) {
			if _, name, _ := due.Parse(pre, string(kv.Key)); name == "bad" {
				return []clientv3.Op{clientv3.OpPut(ns+"x", "1"), clientv3.OpPut(ns+"x", "2")}, true // refused
			}
			return nil, true
		}}
	var pauses []time.Duration
	due.SetPause(ix, func(_ context.Context, d time.Duration) {
		if pauses = append(pauses, d); len(pauses) == good+1 {
			cancel()
		}
	})
	ix.Run(ctx)
	if len(pauses) != good+1 {
		t.Fatalf("%d pauses, want %d", len(pauses), good+1)
	}
	for i, d := range pauses[:good] {
		if d < due.RetryBase || d >= 2*due.RetryBase {
			t.Errorf("pause %d, after a try that moved an item: %v, want [%v, %v)", i+1, d, due.RetryBase, 2*due.RetryBase)
		}
	}
	if d := pauses[good]; d < 2*due.RetryBase {
		t.Errorf("pause after the second failure that moved nothing: %v, want at least %v", d, 2*due.RetryBase)
	}
}

// TestHeldTurnWaitBacksOff: a mover that finds the same batch held read
// after read waits twice as long each time, from 20 ms up to a second,
// and 20 ms again once the first batch held is another.
func TestHeldTurnWaitBacksOff(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	putBacklog(t, cli, ns, base, 20)
	clk := &clock{t: base.Add(time.Hour)}
	ix := index(cli, ns, clk.now)
	ix.Parallel, ix.Turns, ix.Holder = 4, ns+"turns/", "mover0"
	items, err := cli.Get(ctx, ix.Prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var held []string // the turns of the three batches of 7, another's
	for _, i := range []int{0, 7, 14} {
		key := ix.Turns + strings.TrimPrefix(string(items.Kvs[i].Key), ix.Prefix)
		if _, err := cli.Put(ctx, key, "mover1"); err != nil {
			t.Fatal(err)
		}
		held = append(held, key)
	}
	waits := []time.Duration{20, 40, 80, 160, 320, 640, 1000, 1000}
	for i, want := range waits {
		next, m, err := ix.Promote(ctx)
		if err != nil || m != 0 || next.Sub(clk.now()) != want*time.Millisecond {
			t.Fatalf("read %d of the held batches: next in %v, moved %d (%v); want %v, 0", i+1, next.Sub(clk.now()), m, err, want*time.Millisecond)
		}
	}
	if _, err := cli.Delete(ctx, held[0]); err != nil {
		t.Fatal(err)
	}
	if next, m, err := ix.Promote(ctx); err != nil || m != 7 || next.Sub(clk.now()) != turnWait {
		t.Fatalf("the first batch free: next in %v, moved %d (%v); want %v, 7", next.Sub(clk.now()), m, err, turnWait)
	}
}

// turnWait is due's first wait for a held batch.
const turnWait = 20 * time.Millisecond

// TestRevokedTurnLeaseIsForgotten: a mover whose turn lease etcd no
// longer has (revoked here) grants a new one at its next read and moves,
// rather than failing every read until its lease would have ended.
func TestRevokedTurnLeaseIsForgotten(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	putBacklog(t, cli, ns, base, 20)
	clk := &clock{t: base.Add(time.Hour)}
	var mu sync.Mutex
	var leases []clientv3.LeaseID // the turns' lease at each gathered move
	a, _, _ := turnMovers(cli, ns, clk.now, func(context.Context) {
		if kvs := turnKeys(t, cli, ns); len(kvs) > 0 {
			mu.Lock()
			leases = append(leases, clientv3.LeaseID(kvs[0].Lease))
			mu.Unlock()
		}
	})
	a.TurnTTL = time.Minute
	if _, m, err := a.Promote(ctx); err != nil || m != 20 || len(leases) == 0 {
		t.Fatalf("moved %d (%v), %d leases seen; want 20 under a lease", m, err, len(leases))
	}
	first := leases[0]
	if _, err := cli.Revoke(ctx, first); err != nil {
		t.Fatal(err)
	}
	putBacklog(t, cli, ns, base.Add(time.Second), 20)
	if _, m, err := a.Promote(ctx); err != nil || m != 20 {
		t.Fatalf("after the lease was revoked: moved %d (%v), want 20", m, err)
	}
	if last := leases[len(leases)-1]; last == first || last == 0 {
		t.Fatalf("turns of the read after the revoke under lease %x, want a new one (not %x)", last, first)
	}
}

// failingGrant is a Lease whose grants fail.
type failingGrant struct{ clientv3.Lease }

func (failingGrant) Grant(context.Context, int64) (*clientv3.LeaseGrantResponse, error) {
	return nil, errors.New("no lease today")
}

// TestFailingGrantMovesWithoutTurns: a mover that cannot grant a turn
// lease moves its items without turns (they are advisory) and says so in
// its log, rather than moving nothing.
func TestFailingGrantMovesWithoutTurns(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	base := time.Unix(1_800_000_000, 0)
	putBacklog(t, cli, ns, base, 20)
	cli.Lease = failingGrant{cli.Lease}
	clk := &clock{t: base.Add(time.Hour)}
	var turnsSeen atomic.Int64
	a, _, log := turnMovers(cli, ns, clk.now, func(context.Context) { turnsSeen.Add(int64(len(turnKeys(t, cli, ns)))) })
	var buf syncBuffer
	a.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	if _, m, err := a.Promote(context.Background()); err != nil || m != 20 {
		t.Fatalf("moved %d (%v), want 20", m, err)
	}
	log.check(t, 20, nil)
	if n := turnsSeen.Load(); n != 0 {
		t.Fatalf("%d turn keys seen during the moves, want none", n)
	}
	if !strings.Contains(buf.String(), "no lease today") {
		t.Fatalf("log %q, want the failed grant", buf.String())
	}
}

// TestLateMoveSparesAnothersTurn: a move that ends after its turn's
// lease did, when another mover holds the batch's turn, leaves that turn
// key alone (its delete compares the key's value with its own id).
func TestLateMoveSparesAnothersTurn(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	putBacklog(t, cli, ns, base, 20)
	clk := &clock{t: base.Add(time.Hour)}
	hung, release := make(chan struct{}, 8), make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let)
	a, _, log := turnMovers(cli, ns, clk.now, func(context.Context) { hung <- struct{}{}; <-release })
	a.TurnTTL = time.Minute
	aDone := make(chan error, 1)
	go func() {
		_, m, err := a.Promote(ctx)
		aDone <- errors.Join(err, fmt.Errorf("moved %d", m))
	}()
	for range 3 {
		<-hung
	}
	turns := turnKeys(t, cli, ns)
	if len(turns) != 3 {
		t.Fatalf("%d turn keys while a hangs, want 3", len(turns))
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(turns[0].Lease)); err != nil { // as if it ended
		t.Fatal(err)
	}
	for _, kv := range turns { // the other mover's turns now
		if _, err := cli.Put(ctx, string(kv.Key), "mover1"); err != nil {
			t.Fatal(err)
		}
	}
	let()
	if err := <-aDone; !strings.Contains(err.Error(), "moved 20") {
		t.Fatalf("the late mover: %v, want its 20 items moved", err)
	}
	log.check(t, 20, nil)
	if left := turnKeys(t, cli, ns); len(left) != 3 || string(left[0].Value) != "mover1" {
		t.Fatalf("turn keys after the late moves: %v, want the other mover's 3", left)
	}
}

// TestMoveEndsWithinItsTurn: a move under a turn is bounded by the
// turn's lease (a second before it ends), not only by RequestTimeout,
// so a move cannot outlive its turn.
func TestMoveEndsWithinItsTurn(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	base := time.Unix(1_800_000_000, 0)
	putBacklog(t, cli, ns, base, 20)
	clk := &clock{t: base.Add(time.Hour)}
	var mu sync.Mutex
	var deadlines []time.Time
	a, _, _ := turnMovers(cli, ns, clk.now, func(ctx context.Context) {
		dl, _ := ctx.Deadline()
		mu.Lock()
		deadlines = append(deadlines, dl)
		mu.Unlock()
	})
	a.TurnTTL, a.RequestTimeout = 2*time.Second, 30*time.Second
	start := time.Now()
	if _, m, err := a.Promote(context.Background()); err != nil || m != 20 {
		t.Fatalf("moved %d (%v), want 20", m, err)
	}
	if len(deadlines) != 3 {
		t.Fatalf("%d moves, want 3", len(deadlines))
	}
	for i, dl := range deadlines { // the request timeout alone: 30 s on
		if dl.IsZero() || !dl.Before(start.Add(10*time.Second)) {
			t.Errorf("move %d's deadline %v after the start, want by the turn's lease (under 10 s)", i, dl.Sub(start))
		}
	}
}
