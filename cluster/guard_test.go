package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fill puts 1 MiB values under prefix until done says so, at most max of
// them, and returns the error of the put that failed, if one did.
func fill(t *testing.T, cli *clientv3.Client, prefix string, max int, done func() bool) error {
	t.Helper()
	big := strings.Repeat("x", 1<<20)
	for i := 0; i < max; i++ {
		if done() {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cli.Put(ctx, fmt.Sprintf("%s%04d", prefix, i), big)
		cancel()
		if err != nil {
			return err
		}
	}
	if !done() {
		t.Fatalf("%d MiB written under %s and still not done", max, prefix)
	}
	return nil
}

// waitUntil polls cond every 50 ms for at most d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !etcdtest.Eventually(d, cond) {
		t.Fatalf("not within %s: %s", d, what)
	}
}

func exists(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	g, err := cli.Get(context.Background(), key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return g.Count > 0
}

func newGuard(t *testing.T, srv *cluster.Server, cli *clientv3.Client, logs *etcdtest.LogBuffer, ns ...string) *cluster.Guard {
	t.Helper()
	return etcdtest.NewGuard(t, cli, cluster.GuardConfig{
		Endpoint:        srv.Endpoints()[0],
		Quota:           srv.Quota(),
		Namespaces:      ns,
		Interval:        50 * time.Millisecond,
		CompactInterval: 200 * time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(logs, nil)),
	})
}

// TestGuardYieldsDataPlaneBeforeControlPlane: on a 64 MiB server filled
// past 70 %, the guard writes the guard key of both namespaces it serves; a
// checkpoint write then fails with drover.ErrStoreFull, naming usage and
// quota, while a lease is granted and a lock acquired. Once the filler is
// deleted the guard compacts, defragments and removes the keys, and
// checkpoint writes work again.
func TestGuardYieldsDataPlaneBeforeControlPlane(t *testing.T) {
	const quota = 64 << 20
	srv, cli := etcdtest.QuotaServer(t, quota)
	ctx := context.Background()
	ns, other := etcdtest.Namespace(t), etcdtest.Namespace(t)
	keys := keyspace.MustNew(ns)
	var logs etcdtest.LogBuffer
	g := newGuard(t, srv, cli, &logs, ns, other)
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	full := func() bool { return exists(t, cli, keys.StoreFull()) }
	// Filled until the key is set and more than 68 % is in use: well above
	// the low-water mark, so that the guard's compactions free too little
	// to clear the key before the filler is deleted.
	inUse := func() int64 {
		st, err := cli.Status(ctx, srv.Endpoints()[0])
		if err != nil {
			t.Fatal(err)
		}
		return st.DbSizeInUse
	}
	if err := fill(t, cli, keys.Root()+"filler/", 60, func() bool { return full() && inUse() > quota*68/100 }); err != nil {
		t.Fatalf("filling past the high-water mark: %v", err)
	}
	if !exists(t, cli, keyspace.MustNew(other).StoreFull()) {
		t.Fatal("the guard key of the second namespace is missing")
	}
	st, err := cli.Status(ctx, srv.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	if st.DbSize < quota*7/10 {
		t.Fatalf("guard key set at %d MiB, under 70%% of %d MiB", st.DbSize>>20, quota>>20)
	}

	store, err := checkpoint.NewEtcd(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("x")}, nil)
	var sf *drover.StoreFullError
	if !errors.Is(err, drover.ErrStoreFull) || !errors.As(err, &sf) {
		t.Fatalf("checkpoint Put on a full store: %v, want drover.ErrStoreFull", err)
	}
	if sf.Quota != quota || sf.Usage < quota*7/10 || !strings.Contains(err.Error(), "64.0 MiB quota") || !strings.Contains(err.Error(), fmt.Sprintf("%.1f MiB", float64(sf.Usage)/(1<<20))) {
		t.Fatalf("error %q (%+v) does not name usage and quota", err, sf)
	}
	t.Logf("refused: %v", err)

	// The control plane still works.
	if _, err := cli.Grant(ctx, 5); err != nil {
		t.Fatalf("lease grant while the store is full: %v", err)
	}
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("lock.NewEtcd while the store is full: %v", err)
	}
	defer locker.Close(ctx)
	l, err := locker.TryAcquire(ctx, "report")
	if err != nil {
		t.Fatalf("lock while the store is full: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	if !full() {
		t.Fatalf("the guard cleared the key before anything was deleted:\n%s", logs.String())
	}
	if _, err := cli.Delete(ctx, keys.Root()+"filler/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 15*time.Second, "the guard clears the key after the filler is deleted", func() bool { return !full() })
	// The guard logs once its delete has landed, which may be after the
	// read above saw the key gone.
	for _, want := range []string{"past the high-water mark", "compacted", "defragmented", "accepted again", "quota_mib=64"} {
		if !etcdtest.Eventually(5*time.Second, func() bool { return strings.Contains(logs.String(), want) }) {
			t.Fatalf("the guard's log does not say %q:\n%s", want, logs.String())
		}
	}
	if exists(t, cli, keyspace.MustNew(other).StoreFull()) {
		t.Fatal("the second namespace's guard key was left")
	}
	if _, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("x")}, nil); err != nil {
		t.Fatalf("checkpoint Put once space is free: %v", err)
	}
}

// TestGuardRecoversFromNOSPACE: a 32 MiB server written until etcd itself
// refuses ("database space exceeded") raises the NOSPACE alarm and refuses
// lease grants; deletions are still accepted. A guard started then compacts,
// defragments and disarms the alarm: lease grants and puts work again.
func TestGuardRecoversFromNOSPACE(t *testing.T) {
	const quota = 32 << 20
	srv, cli := etcdtest.QuotaServer(t, quota)
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	prefix := keyspace.MustNew(ns).Root() + "filler/"
	err := fill(t, cli, prefix, 60, func() bool { return false })
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("filling a 32 MiB store with 60 MiB: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	if _, err := cli.Grant(ctx, 5); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("lease grant under NOSPACE: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	if _, err := cli.Put(ctx, "/tiny", "x"); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("put under NOSPACE: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	alarms, err := cli.AlarmList(ctx)
	if err != nil || len(alarms.Alarms) == 0 {
		t.Fatalf("alarms under NOSPACE: %v, %v", alarms, err)
	}
	// A transaction with a put in either branch is refused, whichever
	// branch would run (etcd counts the larger branch); one that only
	// deletes is accepted.
	if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("/none"), ">", 0)).
		Then(clientv3.OpPut("/tiny", "x")).Else(clientv3.OpDelete(prefix + "0000")).Commit(); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("txn with a put in the branch not taken, under NOSPACE: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	if _, err := cli.Txn(ctx).Then(clientv3.OpDelete(prefix + "0000")).Commit(); err != nil {
		t.Fatalf("delete-only txn under NOSPACE: %v", err)
	}
	// What a user does: delete (accepted under NOSPACE).
	if _, err := cli.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
		t.Fatalf("delete under NOSPACE: %v", err)
	}

	var logs etcdtest.LogBuffer
	g := newGuard(t, srv, cli, &logs, ns)
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, "the guard disarms the NOSPACE alarm", func() bool {
		a, err := cli.AlarmList(ctx)
		return err == nil && len(a.Alarms) == 0
	})
	// The guard logs the disarm once etcd has answered it, which may be
	// after the alarm list above showed it done.
	for _, want := range []string{"compacted", "defragmented", "disarmed etcd's NOSPACE alarm"} {
		if !etcdtest.Eventually(5*time.Second, func() bool { return strings.Contains(logs.String(), want) }) {
			t.Fatalf("the guard's log does not say %q:\n%s", want, logs.String())
		}
	}
	if _, err := cli.Grant(ctx, 5); err != nil {
		t.Fatalf("lease grant after the guard disarmed: %v", err)
	}
	if _, err := cli.Put(ctx, "/tiny", "x"); err != nil {
		t.Fatalf("put after the guard disarmed: %v", err)
	}
	st, err := cli.Status(ctx, srv.Endpoints()[0])
	if err != nil || st.DbSize >= quota*7/10 {
		t.Fatalf("database after recovery: %v MiB, %v", st.DbSize>>20, err)
	}
}

// TestGuardLifecycle: Close before Start and twice returns nil; Start after
// Close is refused; a started guard's goroutine ends on Close even while it
// waits for its next tick (time is injected: the tick never comes).
func TestGuardLifecycle(t *testing.T) {
	t.Parallel()
	srv, cli := etcdtest.QuotaServer(t, 64<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	checks := make(chan time.Duration, 10)
	never := func(d time.Duration) <-chan time.Time { checks <- d; return nil }
	cfg := cluster.GuardConfig{Endpoint: srv.Endpoints()[0], After: never, Logger: slog.New(slog.DiscardHandler)}

	g, err := cluster.NewGuard(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Close(ctx); err != nil {
		t.Fatalf("Close before Start: %v", err)
	}
	if err := g.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := g.Start(); !errors.Is(err, cluster.ErrGuardClosed) {
		t.Fatalf("Start after Close: %v, want ErrGuardClosed", err)
	}

	g, err = cluster.NewGuard(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Start(); err != nil {
		t.Fatalf("second Start: %v", err)
	}
	select {
	case d := <-checks: // the first check ran; the loop waits for a tick
		if d != cluster.DefaultGuardInterval {
			t.Fatalf("waits %s between checks, want the default %s", d, cluster.DefaultGuardInterval)
		}
	case <-ctx.Done():
		t.Fatal("the started guard never checked")
	}
	st, err := g.Check(ctx)
	if err != nil || st.Full || st.Alarm || st.Quota != 64<<20 || st.Size <= 0 {
		t.Fatalf("Check on an empty store (quota from the member's status): %+v, %v", st, err)
	}
	if err := g.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := g.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if len(checks) != 0 {
		t.Fatalf("%d more checks after the first, with no tick", len(checks))
	}
}

func TestGuardConfigValidate(t *testing.T) {
	t.Parallel()
	ok := cluster.GuardConfig{Endpoint: "127.0.0.1:2379"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*cluster.GuardConfig)
		field string
	}{
		{"no endpoint", func(c *cluster.GuardConfig) { c.Endpoint = "" }, "Endpoint"},
		{"negative quota", func(c *cluster.GuardConfig) { c.Quota = -1 }, "Quota"},
		{"high water 100%", func(c *cluster.GuardConfig) { c.HighWater = 1 }, "HighWater"},
		{"negative high water", func(c *cluster.GuardConfig) { c.HighWater = -0.5 }, "HighWater"},
		{"low water above high", func(c *cluster.GuardConfig) { c.HighWater, c.LowWater = 0.5, 0.6 }, "LowWater"},
		{"low water equal to high", func(c *cluster.GuardConfig) { c.HighWater, c.LowWater = 0.5, 0.5 }, "LowWater"},
		{"negative interval", func(c *cluster.GuardConfig) { c.Interval = -time.Second }, "Interval"},
		{"bad namespace", func(c *cluster.GuardConfig) { c.Namespaces = []string{"a/b"} }, "Namespaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != tc.field {
				t.Fatalf("Validate() = %v, want an InputError naming %s", err, tc.field)
			}
		})
	}
	// A low HighWater alone gets a LowWater below it.
	if err := (cluster.GuardConfig{Endpoint: "x:1", HighWater: 0.3}).Validate(); err != nil {
		t.Fatalf("HighWater 0.3 with the default LowWater: %v", err)
	}
}
