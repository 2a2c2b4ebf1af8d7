package queue_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// submitApart submits n tasks of queue q due at at, per requests of per
// tasks each (each request a segment of its own), ids "{q}-{i}".
func submitApart(t *testing.T, c *queue.Client, q string, n, per int, at time.Time) []string {
	t.Helper()
	var ids []string
	for from := 0; from < n; from += per {
		var in []queue.Task
		for i := from; i < min(from+per, n); i++ {
			id := fmt.Sprintf("%s-%d", q, i)
			ids = append(ids, id)
			in = append(in, queue.Task{ID: id, Type: "x", RunAt: at})
		}
		if res, err := c.Submit(context.Background(), q, in, nil); err != nil || res.Submitted != len(in) {
			t.Fatalf("submit: %+v %v", res, err)
		}
	}
	return ids
}

// openSizes returns the task counts of queue q's open segments, by name.
func openSizes(t *testing.T, cli *clientv3.Client, keys keyspace.Space, q string) map[string]int {
	t.Helper()
	g, err := cli.Get(context.Background(), keys.SegmentsOpen(q), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, kv := range g.Kvs {
		seg, _ := keyspace.OpenSegmentName(keys.SegmentsOpen(q), string(kv.Key))
		out[seg], _ = strconv.Atoi(string(kv.Value))
	}
	return out
}

// claimAll claims queue q's claimable tasks until a claim finds none and
// returns how many times each id was claimed.
func claimAll(t *testing.T, c *queue.Client, cli *clientv3.Client, q string) map[string]int {
	t.Helper()
	l := grantLease(t, cli, 30*time.Second)
	got := map[string]int{}
	for {
		ts, err := c.Claim(context.Background(), q, queue.ClaimRequest{Lease: l, Worker: "w", Max: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) == 0 {
			return got
		}
		for _, tk := range ts {
			got[tk.ID]++
		}
	}
}

// claimedOnce fails unless got holds each of ids once and nothing else.
func claimedOnce(t *testing.T, got map[string]int, ids []string) {
	t.Helper()
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("task %s claimed %d times, want once", id, got[id])
		}
	}
	if len(got) != len(ids) {
		t.Fatalf("%d tasks claimed, want %d", len(got), len(ids))
	}
}

// TestDueMoveGathersSmallSegments: 300 tasks due at one time, submitted
// 3 a request (100 segments of 3), move in segments of up to 100: the
// move of a batch of 64 due segments (192 tasks) writes two, the rest
// (36 segments) two more. Each task's index key names its new place, its
// history says SCHEDULED then PENDING, the sources' records and due keys
// are gone, and claims take each task once.
func TestDueMoveGathersSmallSegments(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	ids := submitApart(t, c, "g", 300, 3, t0.Add(time.Hour))
	if st, err := c.Stats(ctx, "g"); err != nil || st.Scheduled != 300 {
		t.Fatalf("stats: %+v (%v), want 300 scheduled", st, err)
	}
	clk.set(t0.Add(2 * time.Hour))
	if n, err := queue.PromoteScheduled(ctx, c, "g"); err != nil || n != 100 {
		t.Fatalf("promote: moved %d (%v), want the 100 due segments", n, err)
	}
	sizes := openSizes(t, cli, keys, "g")
	var got []int
	for _, n := range sizes {
		got = append(got, n)
	}
	slices.Sort(got)
	if want := []int{8, 92, 100, 100}; !slices.Equal(got, want) {
		t.Fatalf("open segments after the move hold %v tasks, want %v", got, want)
	}
	if g, err := cli.Get(ctx, keys.Segments("g"), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || g.Count != 4 {
		t.Fatalf("segment records: %d (%v), want the 4 gathered ones (the sources deleted)", g.Count, err)
	}
	if g, err := cli.Get(ctx, keys.QueueDue("g"), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || g.Count != 0 {
		t.Fatalf("due keys left: %d (%v)", g.Count, err)
	}
	for _, id := range []string{"g-0", "g-150", "g-299"} {
		g, err := cli.Get(ctx, keys.TaskIndex(id))
		if err != nil || len(g.Kvs) != 1 {
			t.Fatalf("index key of %s: %v", id, err)
		}
		at, ok := keyspace.ParseTaskPlace(string(g.Kvs[0].Value))
		if _, open := sizes[at.Segment]; !ok || !open {
			t.Fatalf("index key of %s names %q, not a gathered segment", id, g.Kvs[0].Value)
		}
		tk, err := c.Get(ctx, id)
		if err != nil || tk.CurrentStatus != queue.Pending || len(tk.Transitions) != 2 ||
			tk.Transitions[0].Status != queue.Scheduled || tk.Transitions[1].Status != queue.Pending {
			t.Fatalf("get %s: %+v (%v), want PENDING after SCHEDULED", id, tk, err)
		}
	}
	if st, err := c.Stats(ctx, "g"); err != nil || st.Scheduled != 0 || st.Pending != 300 {
		t.Fatalf("stats: %+v (%v), want 300 pending", st, err)
	}
	claimedOnce(t, claimAll(t, c, cli, "g"), ids)
}

// TestDueMoveGatheredOnceOnRetry: a gathered move sent again with the
// same read (a mover whose reply was lost, or a second mover that read
// the same keys) moves nothing and writes nothing; each task stays in
// exactly one segment and is claimed once.
func TestDueMoveGatheredOnceOnRetry(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	ids := submitApart(t, c, "r", 60, 2, t0.Add(time.Hour))
	clk.set(t0.Add(2 * time.Hour))
	kvs, err := queue.ReadDueKeys(ctx, c, "r")
	if err != nil || len(kvs) != 30 {
		t.Fatalf("due keys: %d (%v), want 30", len(kvs), err)
	}
	if n, err := queue.MoveDueKeys(ctx, c, "r", kvs); err != nil || n != 30 {
		t.Fatalf("move: %d (%v), want 30", n, err)
	}
	before := keysOf(t, cli, ns)
	for range 2 { // the retry, and another mover with the same read
		if n, err := queue.MoveDueKeys(ctx, c, "r", kvs); err != nil || n != 0 {
			t.Fatalf("move again: %d (%v), want 0", n, err)
		}
	}
	if after := keysOf(t, cli, ns); !mapsEqual(before, after) {
		t.Fatalf("the moves again changed keys: %d keys before, %d after", len(before), len(after))
	}
	if sizes := openSizes(t, cli, keys, "r"); len(sizes) != 1 || sizes[firstKey(sizes)] != 60 {
		t.Fatalf("open segments %v, want one of 60", sizes)
	}
	claimedOnce(t, claimAll(t, c, cli, "r"), ids)
}

// keysOf returns namespace ns's keys and their mod revisions, but for
// the due index's version key, which a move puts whatever it moved.
func keysOf(t *testing.T, cli *clientv3.Client, ns string) map[string]int64 {
	t.Helper()
	g, err := cli.Get(context.Background(), "/"+ns+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range g.Kvs {
		if !strings.HasSuffix(string(kv.Key), "/duever") {
			out[string(kv.Key)] = kv.ModRevision
		}
	}
	return out
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}

// TestDueMoveAfterACancel: a task cancelled after a mover read the due
// keys (an exit in its segment) leaves its segment out of the gathering:
// it opens as it is, the others are gathered. A task cancelled between
// the gathered move's read and its write makes that move fail as a
// whole; the segments then open as they are, one by one. Either way the
// cancelled task is never claimed and the others are claimed once each.
func TestDueMoveAfterACancel(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "before the read", true: "between the read and the move"}[late], func(t *testing.T) {
			ctx := context.Background()
			ns := etcdtest.Namespace(t)
			c, cli := newClient(t, ns)
			keys := keyspace.MustNew(ns)
			t0 := time.Now().UTC().Truncate(time.Second)
			clk := &fakeClock{t: t0}
			queue.SetClock(c, clk.now)
			ids := submitApart(t, c, "x", 40, 2, t0.Add(time.Hour))
			clk.set(t0.Add(2 * time.Hour))
			kvs, err := queue.ReadDueKeys(ctx, c, "x")
			if err != nil || len(kvs) != 20 {
				t.Fatalf("due keys: %d (%v), want 20", len(kvs), err)
			}
			cancel := func() {
				if _, err := c.Cancel(ctx, "x-7"); err != nil {
					t.Error(err)
				}
			}
			if late {
				queue.SetGatherReadHook(func() { queue.SetGatherReadHook(nil); cancel() })
				defer queue.SetGatherReadHook(nil)
			} else {
				cancel()
			}
			if n, err := queue.MoveDueKeys(ctx, c, "x", kvs); err != nil || n != 20 {
				t.Fatalf("move: %d (%v), want 20", n, err)
			}
			var got []int
			for _, n := range openSizes(t, cli, keys, "x") {
				got = append(got, n)
			}
			slices.Sort(got)
			want := []int{2, 38}
			if late {
				want = slices.Repeat([]int{2}, 20)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("open segments hold %v tasks, want %v", got, want)
			}
			if tk, err := c.Get(ctx, "x-7"); err != nil || tk.CurrentStatus != queue.Cancelled {
				t.Fatalf("x-7: %+v (%v), want CANCELLED", tk, err)
			}
			claimedOnce(t, claimAll(t, c, cli, "x"), slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == "x-7" }))
		})
	}
}

// TestDueGatherLevelsReadInOneOrder: two priority levels gathered in one
// move, the exits of one more than a move reads (so its segments open as
// they are), the other's none. Each level's answer must be matched to
// that level: run over several queues so that no map order hides a
// mismatch. The cancelled tasks are never claimed, the others once.
func TestDueGatherLevelsReadInOneOrder(t *testing.T) {
	defer queue.SetGatherExitsRead(1)()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	for run := range 8 {
		q := fmt.Sprintf("lv%d", run)
		var ids []string
		for _, prio := range []int{1, 2} {
			for from := 0; from < 6; from += 2 {
				var in []queue.Task
				for i := from; i < from+2; i++ {
					id := fmt.Sprintf("%s-p%d-%d", q, prio, i)
					ids = append(ids, id)
					in = append(in, queue.Task{ID: id, Type: "x", RunAt: t0.Add(time.Hour), Metadata: queue.Metadata{Priority: prio}})
				}
				if res, err := c.Submit(ctx, q, in, nil); err != nil || res.Submitted != len(in) {
					t.Fatalf("submit: %+v %v", res, err)
				}
			}
		}
		cancelled := []string{q + "-p1-0", q + "-p1-4"}
		for _, id := range cancelled {
			if _, err := c.Cancel(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		clk.set(t0.Add(2 * time.Hour))
		kvs, err := queue.ReadDueKeys(ctx, c, q)
		if err != nil || len(kvs) != 6 {
			t.Fatalf("due keys: %d (%v), want 6", len(kvs), err)
		}
		if n, err := queue.MoveDueKeys(ctx, c, q, kvs); err != nil || n != 6 {
			t.Fatalf("move: %d (%v), want 6", n, err)
		}
		var got []int
		for _, n := range openSizes(t, cli, keyspace.MustNew(ns), q) {
			got = append(got, n)
		}
		slices.Sort(got)
		if want := []int{2, 2, 2, 6}; !slices.Equal(got, want) {
			t.Fatalf("run %d: open segments hold %v tasks, want %v (level 1 as it is, level 2 gathered)", run, got, want)
		}
		claimedOnce(t, claimAll(t, c, cli, q), slices.DeleteFunc(ids, func(id string) bool { return slices.Contains(cancelled, id) }))
		clk.set(t0)
	}
}

// TestDueGatherNameTaken: a gathered segment whose name a record already
// has (a closed or scheduled segment) is not written: the record stays
// as it was, the sources open one by one, and each task is claimed once.
func TestDueGatherNameTaken(t *testing.T) {
	defer queue.SetGatheredSuffix("staken")()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	ids := submitApart(t, c, "n", 20, 2, t0.Add(time.Hour))
	g, err := cli.Get(ctx, keys.Segments("n"), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("segment records: %v", err)
	}
	lv, at, ok := keyspace.ParseSegmentName(strings.TrimPrefix(string(g.Kvs[0].Key), keys.Segments("n")))
	if !ok {
		t.Fatalf("segment name of %q", g.Kvs[0].Key)
	}
	taken := keys.Segment("n", keyspace.SegmentName(lv, at, "staken"))
	if _, err := cli.Put(ctx, taken, "an older segment"); err != nil {
		t.Fatal(err)
	}
	clk.set(t0.Add(2 * time.Hour))
	if n, err := queue.PromoteScheduled(ctx, c, "n"); err != nil || n != 10 {
		t.Fatalf("promote: moved %d (%v), want the 10 due segments", n, err)
	}
	if g, err := cli.Get(ctx, taken); err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "an older segment" {
		t.Fatalf("the record of the taken name: %v (%v), want it as it was", g.Kvs, err)
	}
	if sizes := openSizes(t, cli, keys, "n"); len(sizes) != 10 {
		t.Fatalf("open segments %v, want the 10 sources as they are", sizes)
	}
	claimedOnce(t, claimAll(t, c, cli, "n"), ids)
}

// TestDueGatherKeepsDueOrder: segments due an hour and an hour and a
// second from now, moved in one request, are gathered per due group: a
// gathered segment is named after the latest of its sources, so one that
// took both would take the earlier tasks behind segments due in between.
// Two segments, each named after its own sources' time; a lone source
// two seconds later opens as it is, not rewritten.
func TestDueGatherKeepsDueOrder(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	early, late := t0.Add(time.Hour), t0.Add(time.Hour+time.Second)
	lone := t0.Add(time.Hour + 2*time.Second)
	var ids []string
	for i := range 13 {
		id := fmt.Sprintf("o-%d", i)
		ids = append(ids, id)
		at := early
		if i >= 6 {
			at = late
		}
		if i == 12 {
			at = lone
		}
		if res, err := c.Submit(ctx, "o", []queue.Task{{ID: id, Type: "x", RunAt: at}}, nil); err != nil || res.Submitted != 1 {
			t.Fatalf("submit: %+v %v", res, err)
		}
	}
	clk.set(t0.Add(2 * time.Hour))
	kvs, err := queue.ReadDueKeys(ctx, c, "o")
	if err != nil || len(kvs) != 13 {
		t.Fatalf("due keys: %d (%v), want 13", len(kvs), err)
	}
	loneSeg, _ := queue.DueKeySegment(c, "o", kvs[12])
	if n, err := queue.MoveDueKeys(ctx, c, "o", kvs); err != nil || n != 13 {
		t.Fatalf("move: %d (%v), want 13", n, err)
	}
	sizes := openSizes(t, cli, keys, "o")
	got := map[time.Time]int{}
	for seg, n := range sizes {
		_, at, _ := keyspace.ParseSegmentName(seg)
		got[at.UTC()] += n
	}
	if len(sizes) != 3 || got[early] != 6 || got[late] != 6 || sizes[loneSeg] != 1 {
		t.Fatalf("open segments %v, want one of 6 named at %v, one of 6 at %v, and %s as it was", sizes, early, late, loneSeg)
	}
	for _, id := range []string{"o-0", "o-11"} {
		g, err := cli.Get(ctx, keys.TaskIndex(id))
		if err != nil || len(g.Kvs) != 1 {
			t.Fatalf("index key of %s: %v", id, err)
		}
		at, _ := keyspace.ParseTaskPlace(string(g.Kvs[0].Value))
		if _, when, _ := keyspace.ParseSegmentName(at.Segment); !when.Equal(map[bool]time.Time{true: early, false: late}[id == "o-0"]) {
			t.Fatalf("%s moved to %s, a segment of another due group", id, at.Segment)
		}
	}
	claimedOnce(t, claimAll(t, c, cli, "o"), ids)
}

// TestDueGatherSearchSkipsGatheredAway: a search that read the records of
// scheduled segments just before they were gathered into one (named to
// be walked after them, by a later page) finds each task at most once:
// never a ghost of its old segment beside it in its new one.
func TestDueGatherSearchSkipsGatheredAway(t *testing.T) {
	defer queue.SetGatheredSuffix("szzzz")() // walked after its sources
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	ids := submitApart(t, c, "s", 20, 2, t0.Add(time.Hour))
	clk.set(t0.Add(2 * time.Hour))
	kvs, err := queue.ReadDueKeys(ctx, c, "s")
	if err != nil || len(kvs) != 10 {
		t.Fatalf("due keys: %d (%v), want 10", len(kvs), err)
	}
	queue.SetSearchRecordsHook(func() {
		queue.SetSearchRecordsHook(nil)
		if n, err := queue.MoveDueKeys(ctx, c, "s", kvs); err != nil || n != 10 {
			t.Errorf("move: %d (%v), want 10", n, err)
		}
	})
	defer queue.SetSearchRecordsHook(nil)
	seen := map[string]int{}
	sq := queue.SearchQuery{Limit: 2} // pages: the later ones read names after the move
	for {
		p, err := c.Search(ctx, "s", sq)
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range p.Tasks {
			seen[tk.ID]++
		}
		if p.Next == "" {
			break
		}
		sq.Cursor = p.Next
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("search found %s %d times, want once", id, n)
		}
	}
	if len(seen) > len(ids) {
		t.Fatalf("search found %d tasks, want at most %d", len(seen), len(ids))
	}
}

// moveOnce returns a hook that moves the due segments kvs of queue q,
// gathered, the first time it runs, and resets itself with reset.
func moveOnce(t *testing.T, c *queue.Client, q string, kvs []*mvccpb.KeyValue, reset func(func())) func() {
	return func() {
		reset(nil)
		if n, err := queue.MoveDueKeys(context.Background(), c, q, kvs); err != nil || n != len(kvs) {
			t.Errorf("move: %d (%v), want %d", n, err, len(kvs))
		}
	}
}

// TestDueGatherSafetyChecks: a cancel that read its task before the
// move, and changes it after, fails its compare on the source's record
// and cancels the task at its new place (never claimed); a Get that read
// the task's index key before the move and its segment after follows the
// index key to the new place.
func TestDueGatherSafetyChecks(t *testing.T) {
	for _, op := range []string{"cancel", "get"} {
		t.Run(op, func(t *testing.T) {
			ctx := context.Background()
			ns := etcdtest.Namespace(t)
			c, cli := newClient(t, ns)
			keys := keyspace.MustNew(ns)
			t0 := time.Now().UTC().Truncate(time.Second)
			clk := &fakeClock{t: t0}
			queue.SetClock(c, clk.now)
			ids := submitApart(t, c, "k", 20, 2, t0.Add(time.Hour))
			clk.set(t0.Add(2 * time.Hour))
			kvs, err := queue.ReadDueKeys(ctx, c, "k")
			if err != nil || len(kvs) != 10 {
				t.Fatalf("due keys: %d (%v), want 10", len(kvs), err)
			}
			if op == "cancel" {
				queue.SetSegmentUnchangedHook(moveOnce(t, c, "k", kvs, queue.SetSegmentUnchangedHook))
				defer queue.SetSegmentUnchangedHook(nil)
				if _, err := c.Cancel(ctx, "k-7"); err != nil {
					t.Fatalf("cancel: %v", err)
				}
			} else {
				queue.SetSegmentSlotsHook(moveOnce(t, c, "k", kvs, queue.SetSegmentSlotsHook))
				defer queue.SetSegmentSlotsHook(nil)
				tk, err := c.Get(ctx, "k-7")
				if err != nil || tk.CurrentStatus != queue.Pending {
					t.Fatalf("get k-7 across the move: %+v (%v), want PENDING", tk, err)
				}
			}
			if sizes := openSizes(t, cli, keys, "k"); len(sizes) != 1 || sizes[firstKey(sizes)] != 20 {
				t.Fatalf("open segments %v, want the one gathered of 20", sizes)
			}
			if op == "get" {
				claimedOnce(t, claimAll(t, c, cli, "k"), ids)
				return
			}
			if tk, err := c.Get(ctx, "k-7"); err != nil || tk.CurrentStatus != queue.Cancelled {
				t.Fatalf("k-7: %+v (%v), want CANCELLED", tk, err)
			}
			claimedOnce(t, claimAll(t, c, cli, "k"), slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == "k-7" }))
		})
	}
}
