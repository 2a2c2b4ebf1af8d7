package due_test

import (
	"context"
	"errors"
	"fmt"
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

// moveLog counts, per item name, the moves that won it, over all movers.
type moveLog struct {
	mu    sync.Mutex
	moves map[string]int
}

func (l *moveLog) onMoved(prefix string) func([]*mvccpb.KeyValue) {
	return func(kvs []*mvccpb.KeyValue) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, kv := range kvs {
			_, name, _ := due.Parse(prefix, string(kv.Key))
			l.moves[name]++
		}
	}
}

// check fails unless the n items due were each moved exactly once, and
// none of those not due.
func (l *moveLog) check(t *testing.T, n int, notDue []string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range n {
		if m := l.moves[fmt.Sprintf("item%03d", i)]; m != 1 {
			t.Errorf("item%03d moved %d times, want 1", i, m)
		}
	}
	for _, name := range notDue {
		if l.moves[name] != 0 {
			t.Errorf("%s, not due, moved", name)
		}
	}
}

// turnMovers returns two gathering movers of one index under ns with
// turns (TurnTTL 1 s, etcd's least then applies) and their move log; the
// first's Gather calls hang(ctx) first.
func turnMovers(cli *clientv3.Client, ns string, now func() time.Time, hang func(ctx context.Context)) (a, b *due.Index, log *moveLog) {
	log = &moveLog{moves: map[string]int{}}
	movers := make([]*due.Index, 2)
	for i := range movers {
		ix := gathering(cli, ns, now, ns+"guard")
		ix.Parallel, ix.Turns, ix.TurnTTL, ix.Holder = 4, ns+"turns/", time.Second, fmt.Sprint("mover", i)
		ix.OnMoved = log.onMoved(ix.Prefix)
		movers[i] = ix
	}
	gather := movers[0].Gather
	movers[0].Gather = func(ctx context.Context, kvs []*mvccpb.KeyValue) ([]clientv3.Cmp, []clientv3.Op, error) {
		hang(ctx)
		return gather(ctx, kvs)
	}
	return movers[0], movers[1], log
}

// putLater puts items due after base+1h, the test's now: none may move.
func putLater(t *testing.T, cli *clientv3.Client, ns string, base time.Time) []string {
	t.Helper()
	names := []string{"later0", "later1"}
	for i, name := range names {
		if _, err := cli.Put(context.Background(), due.Key(ns+"due/", base.Add(time.Hour+time.Duration(i+1)*time.Second), name), "v"); err != nil {
			t.Fatal(err)
		}
	}
	return names
}

// takeOver promotes with ix until it moved want items in all, at most
// tries times, a pause between, and returns how many tries moved none.
func takeOver(t *testing.T, ix *due.Index, want, tries int) (idle int) {
	t.Helper()
	moved := 0
	for range tries {
		_, m, err := ix.Promote(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if moved += m; moved == want {
			return idle
		}
		if m == 0 {
			idle++
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("moved %d of %d in %d tries", moved, want, tries)
	return idle
}

// TestHungMoverTurnExpires: a mover whose moves hang, not even ending
// with their context (a process stopped mid-move), holds its turns only
// as long as their lease: the other mover finds them held, then, once
// the lease ended in etcd, takes the batches over and moves every due
// item once; the hung mover, let go, moves nothing twice, and no item
// not due moves.
func TestHungMoverTurnExpires(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	base := time.Unix(1_800_000_000, 0)
	const n = 20
	putBacklog(t, cli, ns, base, n)
	later := putLater(t, cli, ns, base)
	clk := &clock{t: base.Add(time.Hour)}
	hung, release := make(chan struct{}, 8), make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let) // a's moves end whatever fails
	a, b, log := turnMovers(cli, ns, clk.now, func(context.Context) { hung <- struct{}{}; <-release })
	a.TurnTTL = 4 * time.Second // b's first look finds the turns held, however loaded the machine
	aDone := make(chan error, 1)
	go func() {
		_, m, err := a.Promote(context.Background())
		aDone <- errors.Join(err, fmt.Errorf("moved %d", m))
	}()
	for range 3 { // 20 items, batches of 7: three turns taken, three moves hung
		<-hung
	}
	turns, err := cli.Get(context.Background(), ns+"turns/", clientv3.WithPrefix())
	if err != nil || len(turns.Kvs) != 3 || string(turns.Kvs[0].Value) != "mover0" || turns.Kvs[0].Lease == 0 {
		t.Fatalf("turn keys while the first mover hangs: %v (%v), want 3 of mover0 under a lease", turns.Kvs, err)
	}
	_, m, err := b.Promote(context.Background())
	if err != nil || m != 0 {
		t.Fatalf("the second mover while the turns are held: moved %d (%v), want 0", m, err)
	}
	idle := takeOver(t, b, n, 200)
	let()
	if err := <-aDone; !strings.Contains(err.Error(), "moved 0") {
		t.Fatalf("the hung mover, let go: %v, want it to move nothing", err)
	}
	log.check(t, n, later)
	left, err := cli.Get(context.Background(), ns+"due/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || left.Count != int64(len(later)) {
		t.Fatalf("%d items left due (%v), want the %d not due", left.Count, err, len(later))
	}
	t.Logf("the second mover found the turns held %d times before they expired", idle+1)
}

// TestHungRequestEndsItsTurn: a move whose request hangs until its
// context ends is cut at RequestTimeout (the default, 3 s) and gives its
// turns back at once, long before their lease (a minute) ends: the other
// mover moves every due item on its first try.
func TestHungRequestEndsItsTurn(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	base := time.Unix(1_800_000_000, 0)
	const n = 20
	putBacklog(t, cli, ns, base, n)
	later := putLater(t, cli, ns, base)
	clk := &clock{t: base.Add(time.Hour)}
	a, b, log := turnMovers(cli, ns, clk.now, func(ctx context.Context) { <-ctx.Done() })
	a.TurnTTL, b.TurnTTL = time.Minute, time.Minute // no turn may end by its lease here
	if _, m, err := a.Promote(context.Background()); !errors.Is(err, context.DeadlineExceeded) || m != 0 {
		t.Fatalf("the hung mover: moved %d (%v), want 0 and its deadline", m, err)
	}
	turns, err := cli.Get(context.Background(), ns+"turns/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || turns.Count != 0 {
		t.Fatalf("%d turn keys after the cut moves (%v), want 0", turns.Count, err)
	}
	if _, m, err := b.Promote(context.Background()); err != nil || m != n {
		t.Fatalf("the other mover: moved %d (%v), want %d at once", m, err, n)
	}
	log.check(t, n, later)
}

// committedButFailed commits the first transaction after armed is set
// and answers an error, as a reply lost after etcd applied the request.
type committedButFailed struct {
	clientv3.KV
	armed atomic.Bool
}

type failingTxn struct {
	clientv3.Txn
	fail bool
}

func (k *committedButFailed) Txn(ctx context.Context) clientv3.Txn {
	return &failingTxn{Txn: k.KV.Txn(ctx), fail: k.armed.Swap(false)}
}

func (t *failingTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *failingTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *failingTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *failingTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if t.fail && err == nil {
		return nil, errors.New("the reply was lost")
	}
	return resp, err
}

// TestCommittedTurnIsTheMoversOwn: a turn request that committed but
// answered an error leaves the turns taken; the same mover's next read
// finds them its own and moves the batches, while another mover finds
// them held.
func TestCommittedTurnIsTheMoversOwn(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	base := time.Unix(1_800_000_000, 0)
	const n = 20
	putBacklog(t, cli, ns, base, n)
	later := putLater(t, cli, ns, base)
	clk := &clock{t: base.Add(time.Hour)}
	lost := &committedButFailed{KV: cli.KV}
	cli.KV = lost
	a, b, log := turnMovers(cli, ns, clk.now, func(context.Context) {})
	a.TurnTTL, b.TurnTTL = time.Minute, time.Minute // no turn may end by its lease here
	lost.armed.Store(true)
	if _, m, err := a.Promote(context.Background()); err == nil || m != 0 {
		t.Fatalf("the turn request answering an error: moved %d (%v), want 0 and the error", m, err)
	}
	turns, err := cli.Get(context.Background(), ns+"turns/", clientv3.WithPrefix())
	if err != nil || len(turns.Kvs) != 3 || string(turns.Kvs[0].Value) != "mover0" {
		t.Fatalf("turn keys after it: %v (%v), want the 3 taken", turns.Kvs, err)
	}
	if _, m, err := b.Promote(context.Background()); err != nil || m != 0 {
		t.Fatalf("the other mover: moved %d (%v), want 0", m, err)
	}
	if _, m, err := a.Promote(context.Background()); err != nil || m != n {
		t.Fatalf("the same mover again: moved %d (%v), want %d", m, err, n)
	}
	log.check(t, n, later)
	if turns, err := cli.Get(context.Background(), ns+"turns/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || turns.Count != 0 {
		t.Fatalf("%d turn keys left (%v), want 0", turns.Count, err)
	}
}

// TestRunBacksOffFailingMoves: a Run whose moves keep failing pauses
// RetryBase after the first failure, twice as long after each in a row,
// up to RetryMax (each pause d to 2d with jitter).
func TestRunBacksOffFailingMoves(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := cli.Put(ctx, due.Key(ns+"due/", time.Now().Add(-time.Second), "bad"), "v"); err != nil {
		t.Fatal(err)
	}
	ix := &due.Index{Client: cli, Prefix: ns + "due/", Name: "test-backoff", Turns: ns + "turns/",
		Move: func(*mvccpb.KeyValue) ([]clientv3.Op, bool) {
			return []clientv3.Op{clientv3.OpPut(ns+"x", "1"), clientv3.OpPut(ns+"x", "2")}, true // refused
		}}
	var pauses []time.Duration
	due.SetPause(ix, func(_ context.Context, d time.Duration) {
		if pauses = append(pauses, d); len(pauses) == 9 {
			cancel()
		}
	})
	ix.Run(ctx)
	for i, d := range pauses {
		least := min(due.RetryBase<<i, due.RetryMax)
		if d < least || d >= 2*least {
			t.Errorf("pause after failure %d: %v, want [%v, %v)", i+1, d, least, 2*least)
		}
	}
	if turns, err := cli.Get(context.Background(), ns+"turns/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || turns.Count != 0 {
		t.Fatalf("%d turn keys left by the failed moves (%v), want 0", turns.Count, err)
	}
}
