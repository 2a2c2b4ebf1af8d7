package queue_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The store-full tests run their own small embedded server (the package's
// shared one has etcd's 4 GiB default quota): fill it with tasks through
// queue.Client.Submit, and check what the guard (cluster.Guard) and etcd's
// own NOSPACE alarm do to the queue.

// The marks of the tests' guard. At this scale the submissions made
// between two checks (100 ms) can take 10 % of the quota, and a worker
// running the tasks of a full store adds another 10 % or so (outcomes, and
// history until the next compaction), so the room above the high-water
// mark is 40 %, not the default 30 %.
const (
	testHighWater = 0.6
	testLowWater  = 0.5
)

// startGuard starts a guard of s on namespace ns that checks every 100 ms
// and compacts at most every 2 s; it is closed when the test ends. (Much
// more frequent compactions under a worker's load grow the database file
// faster than its contents, and the guard defragments only once under
// the low-water mark.)
func startGuard(t *testing.T, s *cluster.Server, cli *clientv3.Client, logs *etcdtest.LogBuffer, ns string) {
	t.Helper()
	g := etcdtest.NewGuard(t, cli, cluster.GuardConfig{
		Endpoint:        s.Endpoints()[0],
		Quota:           s.Quota(),
		Namespaces:      []string{ns},
		HighWater:       testHighWater,
		LowWater:        testLowWater,
		Interval:        100 * time.Millisecond,
		CompactInterval: 2 * time.Second,
		Logger:          slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
}

// bigTasks returns n tasks of batch b with unique ids, each with an
// input_data_uri of about 2 KB of random text: segments are compressed,
// so the text must not compress away.
func bigTasks(rng *rand.Rand, b, n int) []queue.Task {
	out := make([]queue.Task, n)
	raw := make([]byte, 1500)
	for i := range out {
		for k := range raw {
			raw[k] = byte(rng.Uint32())
		}
		out[i] = queue.Task{ID: fmt.Sprintf("b%03d-t%04d", b, i), Type: "fill",
			InputDataURI: "s3://bucket/inputs/" + base64.RawURLEncoding.EncodeToString(raw)}
	}
	return out
}

func keyExists(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	g, err := cli.Get(context.Background(), key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return g.Count > 0
}

// alarms lists etcd's raised alarms.
func alarms(t *testing.T, cli *clientv3.Client) []*pb.AlarmMember {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := cli.AlarmList(ctx)
	if err != nil {
		t.Fatalf("alarm list: %v", err)
	}
	return a.Alarms
}

// dbStatus says how large etcd's database is, in MiB, for failure messages.
func dbStatus(t *testing.T, s *cluster.Server, cli *clientv3.Client) string {
	t.Helper()
	st, err := cli.Status(context.Background(), s.Endpoints()[0])
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("database file %.1f MiB, in use %.1f MiB, quota %.1f MiB", float64(st.DbSize)/(1<<20), float64(st.DbSizeInUse)/(1<<20), float64(s.Quota())/(1<<20))
}

// prefixBytes counts the keys under prefix and the bytes of their values.
func prefixBytes(t *testing.T, cli *clientv3.Client, prefix string) (int, int) {
	t.Helper()
	g, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, kv := range g.Kvs {
		n += len(kv.Value)
	}
	return len(g.Kvs), n
}

// TestSubmitYieldsWhileStoreFull: on a 32 MiB server whose guard checks
// every 100 ms (high-water mark 60 %), batches of 1,000 tasks of about 2 KB
// each are submitted until Submit fails. It fails with a
// *drover.StoreFullError that names usage and quota, its result counts
// exactly the tasks that went in (Stats agrees), and etcd never reaches its
// own quota, then or later in the test (no NOSPACE alarm, no "database
// space exceeded"). While the guard key is set the control plane
// works (a lease, a lock) and so does the queue's own processing: a
// draining worker runs every task to SUCCEEDED; a checkpoint write is still
// refused. Purging the succeeded tasks frees the space: the guard compacts,
// defragments and clears the key, and Submit works again.
func TestSubmitYieldsWhileStoreFull(t *testing.T) {
	began := time.Now()
	const quota, batch = 32 << 20, 1000
	es, cli := etcdtest.QuotaServer(t, quota)
	ns := etcdtest.Namespace(t)
	keys := keyspace.MustNew(ns)
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	var logs etcdtest.LogBuffer
	startGuard(t, es, cli, &logs, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a guard against a hang, not a measure
	defer cancel()
	const q = "fill"
	rng := rand.New(rand.NewPCG(1, 2))

	total, batches := 0, 0
	var full error
	var last queue.SubmitResult
	for b := 0; b < 60 && full == nil; b++ {
		sctx, scancel := context.WithTimeout(ctx, 15*time.Second)
		res, err := c.Submit(sctx, q, bigTasks(rng, b, batch), nil)
		scancel()
		switch {
		case err == nil:
			if res.Submitted != batch || res.Duplicates != 0 || len(res.Rejected) != 0 {
				t.Fatalf("batch %d: %+v, want %d submitted", b, res, batch)
			}
			total += res.Submitted
			batches++
		case errors.Is(err, drover.ErrStoreFull):
			full, last = err, res
		default:
			t.Fatalf("batch %d, after %d tasks (%s): %v; want success or drover.ErrStoreFull\nguard log:\n%s", b, total, dbStatus(t, es, cli), err, logs.String())
		}
	}
	if full == nil {
		t.Fatalf("60 batches of %d tasks went in and the store never filled (%s)", batch, dbStatus(t, es, cli))
	}
	t.Logf("%d batches in, then refused after %d more tasks (%s): %v", batches, last.Submitted, time.Since(began).Round(time.Millisecond), full)

	// The error: typed, naming usage and quota, saying what to do, and
	// how far the submission got.
	var sf *drover.StoreFullError
	if !errors.As(full, &sf) {
		t.Fatalf("%v is not a *drover.StoreFullError", full)
	}
	if sf.Quota != quota || sf.Usage < quota*6/10 || sf.Usage >= quota || sf.HighWater != testHighWater || sf.LowWater != testLowWater {
		t.Fatalf("StoreFullError %+v: want the 32 MiB quota, the guard's marks and a usage between 60%% and 100%% of the quota", sf)
	}
	for _, want := range []string{
		fmt.Sprintf("uses %.1f MiB of its 32.0 MiB quota", float64(sf.Usage)/(1<<20)),
		"past the 60% high-water mark", "drover tasks purge", "--quota-backend-bytes", "writes resume once less than 50% is in use",
		fmt.Sprintf("(%d of %d submitted; submitting again is safe", last.Submitted, batch),
	} {
		if !strings.Contains(full.Error(), want) {
			t.Fatalf("error %q does not say %q", full, want)
		}
	}
	// The result counts what went in, no more, no less.
	if last.Submitted < 0 || last.Submitted >= batch || last.Duplicates != 0 || len(last.Rejected) != 0 {
		t.Fatalf("result of the refused submission: %+v", last)
	}
	total += last.Submitted
	st, err := c.Stats(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != int64(total) || st.Total() != int64(total) {
		t.Fatalf("stats %+v after %d tasks went in (%d batches + %d)", st, total, batches, last.Submitted)
	}
	// etcd itself never refused: no alarm, and the guard never saw one.
	if a := alarms(t, cli); len(a) != 0 {
		t.Fatalf("etcd raised %v while the guard ran", a)
	}
	if strings.Contains(logs.String(), "NOSPACE") {
		t.Fatalf("the guard saw etcd's NOSPACE alarm:\n%s", logs.String())
	}
	// Another submission is refused at once, and adds nothing.
	if res, err := c.Submit(ctx, q, []queue.Task{{ID: "late", Type: "fill"}}, nil); !errors.Is(err, drover.ErrStoreFull) || res.Submitted != 0 {
		t.Fatalf("one more task while the store is full: %+v, %v", res, err)
	}

	// The control plane: a lease, a lock.
	if _, err := cli.Grant(ctx, 5); err != nil {
		t.Fatalf("lease grant while the store is full: %v", err)
	}
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("lock.NewEtcd while the store is full: %v", err)
	}
	defer locker.Close(context.Background())
	l, err := locker.TryAcquire(ctx, "report")
	if err != nil {
		t.Fatalf("lock while the store is full: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The queue's own processing: claims, outcomes, by a draining worker.
	var ran atomic.Int64
	const workers = 1
	drained := time.Now()
	// Only a guard against a hang: the test asserts that the tasks drain
	// without etcd's alarm, not how fast (under the race detector on a
	// loaded machine a lease can lapse and its claims wait their TTL).
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer wcancel()
	runErr := make(chan error, workers)
	for i := 0; i < workers; i++ {
		w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: q, WorkerID: fmt.Sprintf("w%d", i),
			Concurrency: 64, Prefetch: 100, Drain: true, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("queue.NewWorker while the store is full: %v", err)
		}
		defer w.Close(context.Background())
		w.HandleAll(func(ctx context.Context, task *queue.Task) ([]byte, error) {
			ran.Add(1)
			return []byte("ok"), nil
		})
		go func() { runErr <- w.Run(wctx) }()
	}
	// It runs until the queue drains; etcd's NOSPACE alarm stops it early
	// (every claim would be refused from then on).
	var raised []*pb.AlarmMember
	var runFailed error
	for running := workers; running > 0; {
		select {
		case err := <-runErr:
			running--
			if err != nil && runFailed == nil {
				runFailed = err
			}
		case <-time.After(200 * time.Millisecond):
			if raised == nil {
				if raised = alarms(t, cli); len(raised) > 0 {
					wcancel()
				}
			}
		}
	}
	if len(raised) > 0 {
		t.Fatalf("etcd raised %v while workers ran the %d tasks of the full store (%d ran in %s; %s): "+
			"the queue's own writes (claims, outcomes) grew the database from the high-water mark past etcd's quota\nguard log:\n%s",
			raised, total, ran.Load(), time.Since(drained).Round(time.Millisecond), dbStatus(t, es, cli), logs.String())
	}
	if runFailed != nil || wctx.Err() != nil {
		t.Fatalf("workers on a full store: %v (context: %v); %d of %d ran; %s", runFailed, wctx.Err(), ran.Load(), total, dbStatus(t, es, cli))
	}
	t.Logf("a worker ran the %d tasks on the full store in %s (%s)", ran.Load(), time.Since(drained).Round(time.Millisecond), dbStatus(t, es, cli))
	if st, err = c.Stats(ctx, q); err != nil || st.Succeeded != int64(total) || st.Unfinished() != 0 {
		t.Fatalf("stats after the drain: %+v, %v; want %d SUCCEEDED", st, err, total)
	}
	if ran.Load() < int64(total) {
		t.Fatalf("%d handlers ran for %d tasks", ran.Load(), total)
	}

	// Checkpoints are data plane: still refused.
	if !keyExists(t, cli, keys.StoreFull()) {
		t.Fatalf("the guard cleared the key before anything was deleted (%s):\n%s", dbStatus(t, es, cli), logs.String())
	}
	store, err := checkpoint.NewEtcd(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("x")}, nil); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("checkpoint Put while the guard key is set: %v, want drover.ErrStoreFull", err)
	}

	// Purging what succeeded frees the space; the guard compacts,
	// defragments and clears the key.
	n, err := c.Purge(ctx, q, queue.Succeeded, nil, nil)
	if err != nil || n != total {
		t.Fatalf("purge of the succeeded tasks while the guard key is set: %d of %d purged, %v (%s; alarms %v)\nguard log:\n%s",
			n, total, err, dbStatus(t, es, cli), alarms(t, cli), logs.String())
	}
	if a := alarms(t, cli); len(a) != 0 {
		t.Fatalf("etcd raised %v during the purge (%s)", a, dbStatus(t, es, cli))
	}
	t.Logf("purged %d tasks at %s (%s)", n, time.Since(began).Round(time.Millisecond), dbStatus(t, es, cli))
	if !etcdtest.Eventually(15*time.Second, func() bool { return !keyExists(t, cli, keys.StoreFull()) }) {
		segs, segBytes := prefixBytes(t, cli, keys.Segments(q))
		t.Errorf("the guard did not clear the key within 15 s of purging the %d succeeded tasks (%s): "+
			"%d segment keys of %.1f MiB are left under %s, which Purge does not delete\nguard log:\n%s",
			n, dbStatus(t, es, cli), segs, float64(segBytes)/(1<<20), keys.Segments(q), logs.String())
		// Go on with what DeleteQueue deletes last (a pure DeleteRange),
		// to check the rest of the recovery.
		if _, err := cli.Delete(ctx, keys.Segments(q), clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
		if !etcdtest.Eventually(15*time.Second, func() bool { return !keyExists(t, cli, keys.StoreFull()) }) {
			t.Fatalf("the guard did not clear the key with the segments deleted too (%s):\n%s", dbStatus(t, es, cli), logs.String())
		}
	}
	for _, want := range []string{"past the high-water mark", "compacted", "defragmented", "accepted again", "quota_mib=32"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("the guard's log does not say %q:\n%s", want, logs.String())
		}
	}
	res, err := c.Submit(ctx, q, bigTasks(rng, 999, 10), nil)
	if err != nil || res.Submitted != 10 {
		t.Fatalf("submit once the guard cleared the key: %+v, %v", res, err)
	}
	if _, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("x")}, nil); err != nil {
		t.Fatalf("checkpoint Put once the guard cleared the key: %v", err)
	}
	t.Logf("took %s", time.Since(began).Round(time.Millisecond))
}

// TestSubmitAfterNOSPACE: with no guard, a 24 MiB server is filled through
// Submit until etcd itself refuses ("database space exceeded", NOSPACE
// alarm raised, lease grants refused). Purging the pending tasks works
// under the alarm (it only deletes); a guard started then disarms the
// alarm, after which leases are granted and Submit works again.
func TestSubmitAfterNOSPACE(t *testing.T) {
	began := time.Now()
	const quota, batch = 24 << 20, 1000
	es, cli := etcdtest.QuotaServer(t, quota)
	ns := etcdtest.Namespace(t)
	keys := keyspace.MustNew(ns)
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	const q = "fill"
	rng := rand.New(rand.NewPCG(3, 4))

	total, unsure := 0, 0
	var nospace error
	for b := 0; b < 40 && nospace == nil; b++ {
		sctx, scancel := context.WithTimeout(ctx, 15*time.Second)
		res, err := c.Submit(sctx, q, bigTasks(rng, b, batch), nil)
		scancel()
		total += res.Submitted
		switch {
		case err == nil:
			if res.Submitted != batch {
				t.Fatalf("batch %d: %+v, want %d submitted", b, res, batch)
			}
		case errors.Is(err, rpctypes.ErrNoSpace):
			nospace, unsure = err, batch-res.Submitted
		default:
			t.Fatalf("batch %d, after %d tasks (%s): %v; want success or %v", b, total, dbStatus(t, es, cli), err, rpctypes.ErrNoSpace)
		}
	}
	if nospace == nil {
		t.Fatalf("40 batches of %d tasks and etcd never refused (%s)", batch, dbStatus(t, es, cli))
	}
	if errors.Is(nospace, drover.ErrStoreFull) || !strings.Contains(nospace.Error(), "database space exceeded") {
		t.Fatalf("submission past the quota: %v, want etcd's own error", nospace)
	}
	t.Logf("etcd refused after %d tasks, at %s (%s): %v", total, time.Since(began).Round(time.Millisecond), dbStatus(t, es, cli), nospace)
	raised := alarms(t, cli)
	if len(raised) == 0 || raised[0].Alarm != pb.AlarmType_NOSPACE {
		t.Fatalf("alarms after etcd refused: %v, want NOSPACE", raised)
	}
	if _, err := cli.Grant(ctx, 5); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("lease grant under NOSPACE: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	// etcd applies the transaction that crosses its quota and answers it
	// with "database space exceeded" all the same (its quotaApplierV3), so
	// up to the refused submission's remainder may be in without being
	// counted; nothing counted may be missing.
	st, err := c.Stats(ctx, q)
	if err != nil || st.Pending < int64(total) || st.Pending > int64(total+unsure) || st.Total() != st.Pending {
		t.Fatalf("stats under NOSPACE: %+v, %v; want between %d and %d pending", st, err, total, total+unsure)
	}
	if st.Pending != int64(total) {
		t.Logf("%d tasks are in that Submit did not count: etcd applied a transaction it answered with NOSPACE", st.Pending-int64(total))
	}

	// What a user does: purge (deletions are accepted under NOSPACE).
	n, err := c.Purge(ctx, q, queue.Pending, nil, nil)
	if err != nil || int64(n) != st.Pending {
		t.Errorf("purge of the %d pending tasks under NOSPACE: %d purged, %v; want every one, with no error: "+
			"etcd accepts deletions under NOSPACE, so a purge must only delete", st.Pending, n, err)
		// Go on with pure deletions of the queue's keys, to check the
		// rest of the recovery.
		if _, err := cli.Txn(ctx).Then(clientv3.OpDelete(keys.Segments(q), clientv3.WithPrefix()), clientv3.OpDelete(keys.Queue(q), clientv3.WithPrefix()),
			clientv3.OpDelete(keys.Root()+"ids/", clientv3.WithPrefix())).Commit(); err != nil {
			t.Fatalf("delete-only transaction under NOSPACE: %v", err)
		}
	} else if st, err := c.Stats(ctx, q); err != nil || st.Total() != 0 {
		t.Errorf("stats after the purge: %+v, %v; want nothing left", st, err)
	}

	t.Logf("purged at %s", time.Since(began).Round(time.Millisecond))
	var logs etcdtest.LogBuffer
	startGuard(t, es, cli, &logs, ns)
	if !etcdtest.Eventually(20*time.Second, func() bool { return len(alarms(t, cli)) == 0 }) {
		t.Fatalf("the guard did not disarm the NOSPACE alarm within 20 s (%s):\n%s", dbStatus(t, es, cli), logs.String())
	}
	for _, want := range []string{"compacted", "defragmented", "disarmed etcd's NOSPACE alarm"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("the guard's log does not say %q:\n%s", want, logs.String())
		}
	}
	t.Logf("the guard disarmed the alarm at %s", time.Since(began).Round(time.Millisecond))
	if _, err := cli.Grant(ctx, 5); err != nil {
		t.Fatalf("lease grant after the guard disarmed the alarm: %v", err)
	}
	res, err := c.Submit(ctx, q, bigTasks(rng, 999, batch), nil)
	if err != nil || res.Submitted != batch {
		t.Fatalf("submit after the guard disarmed the alarm: %+v, %v", res, err)
	}
	if keyExists(t, cli, keys.StoreFull()) {
		t.Fatalf("the guard key is set after recovery (%s):\n%s", dbStatus(t, es, cli), logs.String())
	}
	t.Logf("took %s", time.Since(began).Round(time.Millisecond))
}

// TestPurgeDeletesSegmentData: purging tasks frees what they took, as the
// store-full remedy (`drover tasks purge`) needs: once every task of a queue
// is purged, pending or succeeded, nothing is left under the queue's
// segments prefix, where submissions put the tasks' data.
func TestPurgeDeletesSegmentData(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(5, 6))
	for _, st := range []queue.Status{queue.Pending, queue.Succeeded} {
		q := "purge-" + strings.ToLower(string(st))
		res, err := c.Submit(ctx, q, bigTasks(rng, len(q), 250), nil)
		if err != nil || res.Submitted != 250 {
			t.Fatalf("%s: submit: %+v, %v", q, res, err)
		}
		if st == queue.Succeeded {
			w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 16, Drain: true})
			w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return []byte("ok"), nil })
			runDrain(t, w)
		}
		n, err := c.Purge(ctx, q, st, nil, nil)
		if err != nil || n != 250 {
			t.Fatalf("%s: purge of the %s tasks: %d, %v", q, st, n, err)
		}
		if s, err := c.Stats(ctx, q); err != nil || s.Total() != 0 {
			t.Errorf("%s: stats after the purge: %+v, %v; want nothing", q, s, err)
		}
		if segs, size := prefixBytes(t, cli, keys.Segments(q)); segs != 0 {
			t.Errorf("%s: after purging every %s task, %d segment keys (%.1f KiB of task data) are left under %s",
				q, st, segs, float64(size)/(1<<10), keys.Segments(q))
		}
	}
}
