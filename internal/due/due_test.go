package due_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var srv *etcdtest.Server

func TestMain(m *testing.M) { os.Exit(etcdtest.Main(m, &srv, "", nil)) }

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// index returns an index under ns whose moves put "{ns}moved/{name}".
func index(cli *clientv3.Client, ns string, now func() time.Time) *due.Index {
	pre := ns + "due/"
	return &due.Index{Client: cli, Prefix: pre, Now: now, Batch: 7,
		Move: func(kv *mvccpb.KeyValue) ([]clientv3.Op, bool) {
			_, name, _ := due.Parse(pre, string(kv.Key))
			return []clientv3.Op{clientv3.OpPut(ns+"moved/"+name, string(kv.Value))}, true
		}}
}

// TestPromoteMovesOnlyDueItemsOnce: with an injected clock, Promote moves
// exactly the items due by now, says when the next falls due, and four
// indexes racing over the same items move each exactly once.
func TestPromoteMovesOnlyDueItemsOnce(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	for i := range 40 {
		at := base.Add(time.Duration(i) * time.Second)
		if _, err := cli.Put(ctx, due.Key(ns+"due/", at, fmt.Sprintf("item%02d", i)), "v"); err != nil {
			t.Fatal(err)
		}
	}
	clk := &clock{t: base.Add(19*time.Second + time.Millisecond)} // items 0..19 are due
	var moved atomic.Int64
	var wg sync.WaitGroup
	nexts := make([]time.Time, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next, n, err := index(cli, ns, clk.now).Promote(ctx)
			if err != nil {
				t.Error(err)
			}
			moved.Add(int64(n))
			nexts[w] = next
		}()
	}
	wg.Wait()
	if moved.Load() != 20 {
		t.Fatalf("moved %d items in all, want 20 (each due item exactly once)", moved.Load())
	}
	for w, next := range nexts {
		if !next.Equal(base.Add(20 * time.Second)) {
			t.Errorf("index %d: next due %v, want %v", w, next, base.Add(20*time.Second))
		}
	}
	g, err := cli.Get(ctx, ns+"moved/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != 20 {
		t.Fatalf("moved keys: %d (%v), want 20", g.Count, err)
	}
	clk.set(base.Add(time.Hour))
	next, n, err := index(cli, ns, clk.now).Promote(ctx)
	if err != nil || n != 20 || !next.IsZero() {
		t.Fatalf("after the last: moved %d, next %v, err %v; want 20, zero, nil", n, next, err)
	}
}

// TestPromoteFromReadsABacklogInSteps: items due over the last hour, one
// due a year ago and one not due yet, read from before the oldest in steps
// of time (a read to now would count every item due): every due item moves
// once, the one not due stays, and the next due time is its.
func TestPromoteFromReadsABacklogInSteps(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	put := func(at time.Time, name string) {
		t.Helper()
		if _, err := cli.Put(ctx, due.Key(ns+"due/", at, name), "v"); err != nil {
			t.Fatal(err)
		}
	}
	put(base.Add(-365*24*time.Hour), "old")
	for i := range 100 {
		put(base.Add(-time.Hour+time.Duration(i)*time.Second), fmt.Sprintf("item%03d", i))
	}
	put(base.Add(time.Hour), "later")
	clk := &clock{t: base}
	reads := &rangeLog{KV: cli.KV}
	cli.KV = reads
	next, done, n, err := index(cli, ns, clk.now).PromoteFrom(ctx, base.Add(-400*24*time.Hour))
	if err != nil || n != 101 || !next.Equal(base.Add(time.Hour)) || !done.Equal(base) {
		t.Fatalf("moved %d, next %v, done %v, err %v; want 101, %v, %v, nil", n, next, done, err, base.Add(time.Hour), base)
	}
	// In steps: no read runs from the year-old item to now, which would
	// cover every item behind it (and, in a live index, every key moved
	// and not yet compacted).
	old, now := due.Key(ns+"due/", base.Add(-365*24*time.Hour), "old"), due.Bound(ns+"due/", base)
	stepped := false
	for _, r := range reads.all() {
		if r[0] <= old && r[1] >= now {
			t.Fatalf("a read from %q to %q covers the year-old item through now", r[0], r[1])
		}
		stepped = stepped || (r[0] <= old && r[1] != "" && r[1] < now)
	}
	if !stepped {
		t.Fatalf("no read from the year-old item ended before now: %v", reads.all())
	}
	g, err := cli.Get(ctx, ns+"due/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(g.Kvs) != 1 || !strings.HasSuffix(string(g.Kvs[0].Key), "-later") {
		t.Fatalf("left in the index: %v (%v), want the item not due only", g.Kvs, err)
	}
}

// TestRunWakesForAnEarlierItem: a running index that sleeps until an item
// an hour away moves an item put later that is due at once, without
// waiting for the hour, and then one put due an hour ago.
func TestRunWakesForAnEarlierItem(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := cli.Put(ctx, due.Key(ns+"due/", time.Now().Add(time.Hour), "later"), "v"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); index(cli, ns, nil).Run(ctx) }()
	defer wg.Wait()
	defer cancel()
	put, err := cli.Put(ctx, due.Key(ns+"due/", time.Now(), "now"), "v")
	if err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, ns+"moved/", clientv3.WithPrefix(), clientv3.WithRev(put.Header.Revision))
	select {
	case wr := <-wch:
		if len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != ns+"moved/now" {
			t.Fatalf("moved %v, want only %q", wr.Events, ns+"moved/now")
		}
	case <-time.After(time.Minute): // a guard against hanging only
		t.Fatal("the item due now was not moved")
	}
	// An item put due before everything the index moved so far (its
	// submitter's clock behind) is moved too.
	if _, err := cli.Put(ctx, due.Key(ns+"due/", time.Now().Add(-time.Hour), "past"), "v"); err != nil {
		t.Fatal(err)
	}
	select {
	case wr := <-wch:
		if len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != ns+"moved/past" {
			t.Fatalf("moved %v, want only %q", wr.Events, ns+"moved/past")
		}
	case <-time.After(time.Minute): // a guard against hanging only
		t.Fatal("the item due an hour ago was not moved")
	}
}

// TestRunLogsAndCountsErrors: a Run whose moves fail (here a move that
// writes one key twice, which etcd refuses) counts each failure in
// drover_due_errors_total{index} and logs the first, not every retry.
func TestRunLogsAndCountsErrors(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := cli.Put(ctx, due.Key(ns+"due/", time.Now().Add(-time.Second), "bad"), "v"); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	ix := &due.Index{Client: cli, Prefix: ns + "due/", Name: "test-failing", Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Move: func(kv *mvccpb.KeyValue) ([]clientv3.Op, bool) {
			return []clientv3.Op{clientv3.OpPut(ns+"x", "1"), clientv3.OpPut(ns+"x", "2")}, true
		}}
	errs := metrics.DueErrors.WithLabelValues("test-failing")
	before := testutil.ToFloat64(errs) // the counter is the process's: a run before this one counted too
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ix.Run(ctx) }()
	deadline := time.Now().Add(time.Minute) // a guard against hanging only
	for testutil.ToFloat64(errs)-before < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("errors counted: %v, want 3", testutil.ToFloat64(errs)-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	lines := strings.Count(logs.String(), "moving due items failed")
	if lines != 1 || !strings.Contains(logs.String(), "index=test-failing") || !strings.Contains(logs.String(), "duplicate key") {
		t.Fatalf("%d log lines for %v errors, want 1 naming the index and the error:\n%s", lines, testutil.ToFloat64(errs)-before, logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// rangeLog records the key and range end of every Get sent through it.
type rangeLog struct {
	clientv3.KV
	mu     sync.Mutex
	ranges [][2]string
}

func (l *rangeLog) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	op := clientv3.OpGet(key, opts...)
	l.mu.Lock()
	l.ranges = append(l.ranges, [2]string{key, string(op.RangeBytes())})
	l.mu.Unlock()
	return l.KV.Get(ctx, key, opts...)
}

func (l *rangeLog) all() [][2]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][2]string(nil), l.ranges...)
}

// gathering returns index(cli, ns, now) whose moves gather every batch
// into one key, "{ns}gathered/{first item's name}", compared on guard
// being absent.
func gathering(cli *clientv3.Client, ns string, now func() time.Time, guard string) *due.Index {
	ix := index(cli, ns, now)
	ix.Gather = func(_ context.Context, kvs []*mvccpb.KeyValue) ([]clientv3.Cmp, []clientv3.Op, error) {
		_, name, _ := due.Parse(ix.Prefix, string(kvs[0].Key))
		ops := make([]clientv3.Op, 0, 200)
		ops = append(ops, clientv3.OpPut(ns+"gathered/"+name, fmt.Sprint(len(kvs))))
		for i := range 150 { // more than a nested transaction takes beside 14 compares
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%sextra/%s/%03d", ns, name, i), ""))
		}
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(guard), "=", 0)}, ops, nil
	}
	return ix
}

// TestGatheredMoveIsAllOrNothing: an index with Gather moves a batch of
// due items in one transaction (Move not used), however many writes it
// takes (packed into nested transactions within etcd's 128 operations);
// when Gather's compares fail, nothing it wrote is there and the items
// move one by one; sent again with the same read, a move moves nothing.
func TestGatheredMoveIsAllOrNothing(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	for i := range 14 {
		if _, err := cli.Put(ctx, due.Key(ns+"due/", base.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("item%02d", i)), "v"); err != nil {
			t.Fatal(err)
		}
	}
	clk := &clock{t: base.Add(time.Hour)}
	if _, err := cli.Put(ctx, ns+"guard", "x"); err != nil { // the first batch's compares fail
		t.Fatal(err)
	}
	g, err := cli.Get(ctx, ns+"due/", clientv3.WithPrefix(), clientv3.WithLimit(7))
	if err != nil {
		t.Fatal(err)
	}
	ix := gathering(cli, ns, clk.now, ns+"guard")
	if n, err := ix.MoveItems(ctx, g.Kvs); err != nil || n != 7 {
		t.Fatalf("moved %d (%v), want the 7 one by one", n, err)
	}
	count := func(pre string) int64 {
		r, err := cli.Get(ctx, ns+pre, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	if count("gathered/") != 0 || count("extra/") != 0 || count("moved/") != 7 {
		t.Fatalf("after a refused gathered move: %d gathered, %d extra, %d moved; want 0, 0, 7", count("gathered/"), count("extra/"), count("moved/"))
	}
	if _, err := cli.Delete(ctx, ns+"guard"); err != nil {
		t.Fatal(err)
	}
	if _, n, err := ix.Promote(ctx); err != nil || n != 7 {
		t.Fatalf("promote: moved %d (%v), want 7", n, err)
	}
	if count("gathered/") != 1 || count("extra/") != 150 || count("moved/") != 7 {
		t.Fatalf("after a gathered move: %d gathered, %d extra, %d moved; want 1, 150, 7 (Move not used)", count("gathered/"), count("extra/"), count("moved/"))
	}
	if n, err := ix.MoveItems(ctx, g.Kvs); err != nil || n != 0 {
		t.Fatalf("the first batch again: moved %d (%v), want 0", n, err)
	}
}

// TestGatheredMoveAfterALostRace: a gathered move whose read another
// mover partly moved since moves nothing, not even one by one: what is
// left is read again and moves gathered.
func TestGatheredMoveAfterALostRace(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	for i := range 7 {
		if _, err := cli.Put(ctx, due.Key(ns+"due/", base.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("item%02d", i)), "v"); err != nil {
			t.Fatal(err)
		}
	}
	clk := &clock{t: base.Add(time.Hour)}
	g, err := cli.Get(ctx, ns+"due/", clientv3.WithPrefix())
	if err != nil || len(g.Kvs) != 7 {
		t.Fatalf("items: %d (%v)", len(g.Kvs), err)
	}
	ix := gathering(cli, ns, clk.now, ns+"guard")
	if n, err := ix.MoveItems(ctx, g.Kvs[:3]); err != nil || n != 3 { // the other mover
		t.Fatalf("moved %d (%v), want 3", n, err)
	}
	if n, err := ix.MoveItems(ctx, g.Kvs); err != nil || n != 0 {
		t.Fatalf("the stale read moved %d (%v), want 0", n, err)
	}
	count := func(pre string) int64 {
		r, err := cli.Get(ctx, ns+pre, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	if count("moved/") != 0 || count("gathered/") != 1 {
		t.Fatalf("after the lost race: %d moved one by one, %d gathered; want 0, 1", count("moved/"), count("gathered/"))
	}
	if _, n, err := ix.Promote(ctx); err != nil || n != 4 {
		t.Fatalf("promote: moved %d (%v), want the 4 left", n, err)
	}
	if count("moved/") != 0 || count("gathered/") != 2 || count("due/") != 0 {
		t.Fatalf("after the promote: %d moved one by one, %d gathered, %d due; want 0, 2, 0", count("moved/"), count("gathered/"), count("due/"))
	}
}

// TestParallelBatchesMoveABacklogOnce: an index with Parallel moves the
// batches of one read side by side, each gathered on its own, and two
// such indexes racing over a backlog move every item exactly once and
// leave none due.
func TestParallelBatchesMoveABacklogOnce(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	const n = 100
	putBacklog(t, cli, ns, base, n)
	clk := &clock{t: base.Add(time.Hour)}
	movers := make([]*due.Index, 2)
	for i := range movers {
		ix := index(cli, ns, clk.now)
		ix.Parallel = 4 // 28 items a read, in 4 batches of 7
		ix.Gather = func(_ context.Context, kvs []*mvccpb.KeyValue) ([]clientv3.Cmp, []clientv3.Op, error) {
			var ops []clientv3.Op
			for _, kv := range kvs {
				_, name, _ := due.Parse(ix.Prefix, string(kv.Key))
				ops = append(ops, clientv3.OpPut(ns+"gathered/"+name, "")) // a second move of it would be a put again
			}
			return nil, ops, nil
		}
		movers[i] = ix
	}
	moved := promoteAll(t, movers)
	g, err := cli.Get(ctx, ns+"gathered/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	one, err := cli.Get(ctx, ns+"moved/", clientv3.WithPrefix()) // a batch of one item moves by itself
	if err != nil {
		t.Fatal(err)
	}
	seen, twice := map[string]bool{}, 0
	for _, kv := range append(g.Kvs, one.Kvs...) {
		name := string(kv.Key[strings.LastIndexByte(string(kv.Key), '/')+1:])
		if kv.Version != 1 || seen[name] {
			twice++
		}
		seen[name] = true
	}
	left, err := cli.Get(ctx, ns+"due/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if moved != int64(n) || len(seen) != n || twice != 0 || left.Count != 0 {
		t.Fatalf("moved %d, %d items moved (%d twice), %d left due; want %d, %d, 0, 0", moved, len(seen), twice, left.Count, n, n)
	}
}

// TestTurnsShareABacklog: two indexes with turns (Index.Turns)
// move a backlog of due items each exactly once, leave no turn key, and
// a batch whose turn another holds is left to it and read again later.
func TestTurnsShareABacklog(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	base := time.Unix(1_800_000_000, 0)
	const n = 100
	putBacklog(t, cli, ns, base, n)
	l, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	// The first batch's turn is another mover's: it is left alone.
	g, err := cli.Get(ctx, ns+"due/", clientv3.WithPrefix(), clientv3.WithLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	held := ns + "turns/" + strings.TrimPrefix(string(g.Kvs[0].Key), ns+"due/")
	if _, err := cli.Put(ctx, held, "", clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: base.Add(time.Hour)}
	movers := make([]*due.Index, 2)
	for i := range movers {
		ix := index(cli, ns, clk.now)
		ix.Parallel, ix.Turns = 4, ns+"turns/"
		movers[i] = ix
	}
	next, done, m, err := movers[0].PromoteFrom(ctx, time.Time{})
	if err != nil || m != n-7 || !done.Equal(base) || next.IsZero() {
		t.Fatalf("with the first batch's turn held: moved %d (%v), done %v, next %v; want %d, %v, soon", m, err, done, next, n-7, base)
	}
	if _, err := cli.Delete(ctx, held); err != nil { // the other mover ended
		t.Fatal(err)
	}
	moved := promoteAll(t, movers)
	count := func(pre string) int64 {
		r, err := cli.Get(ctx, ns+pre, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	if moved != 7 || count("moved/") != n || count("due/") != 0 || count("turns/") != 0 {
		t.Fatalf("then moved %d, %d in all, %d due, %d turn keys; want 7, %d, 0, 0", moved, count("moved/"), count("due/"), count("turns/"), n)
	}
}

// putBacklog puts n items due under ns+"due/", a millisecond apart from
// base on.
func putBacklog(t *testing.T, cli *clientv3.Client, ns string, base time.Time, n int) {
	t.Helper()
	for i := range n {
		if _, err := cli.Put(context.Background(), due.Key(ns+"due/", base.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("item%03d", i)), "v"); err != nil {
			t.Fatal(err)
		}
	}
}

// promoteAll runs one Promote of each of movers at once and returns how
// many items they moved in all.
func promoteAll(t *testing.T, movers []*due.Index) int64 {
	var moved atomic.Int64
	var wg sync.WaitGroup
	for _, ix := range movers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, m, err := ix.Promote(context.Background())
			if err != nil {
				t.Error(err)
			}
			moved.Add(int64(m))
		}()
	}
	wg.Wait()
	return moved.Load()
}
