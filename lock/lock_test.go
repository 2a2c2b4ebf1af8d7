package lock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/lock/internal/proctest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newLocker(t *testing.T, cli *clientv3.Client, ns string, ttl time.Duration, id string) *lock.Etcd {
	t.Helper()
	l, err := lock.NewEtcd(context.Background(), cli, lock.EtcdConfig{Namespace: ns, TTL: ttl, HolderID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func countKeys(t *testing.T, cli *clientv3.Client, ns string) int64 {
	t.Helper()
	g, err := cli.Get(context.Background(), keyspace.MustNew(ns).Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return g.Count
}

func TestMutualExclusion(t *testing.T) {
	t.Parallel()
	const goroutines, procs, iters = 8, 3, 10
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	counter, logPath := filepath.Join(dir, "counter"), filepath.Join(dir, "log")

	var helpers []*proctest.Helper
	for i := 0; i < procs; i++ {
		helpers = append(helpers, startHelper(t, "counter", "H_NS="+ns, "H_LOCK=counter", "H_TTL=5s",
			"H_ITER="+strconv.Itoa(iters), "H_COUNTER="+counter, "H_LOG="+logPath, fmt.Sprintf("H_ID=proc-%d", i)))
	}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		locker := newLocker(t, cli, ns, 5*time.Second, fmt.Sprintf("goroutine-%d", g))
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			for i := 0; i < iters; i++ {
				l, err := locker.Acquire(context.Background(), "counter")
				if err != nil {
					errs <- err
					return
				}
				if err := proctest.CriticalSection(counter, logPath, id); err != nil {
					errs <- err
					return
				}
				if err := l.Release(context.Background()); err != nil {
					errs <- err
					return
				}
			}
		}(fmt.Sprintf("goroutine-%d", g))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, h := range helpers {
		if err := h.Cmd.Wait(); err != nil {
			t.Fatalf("helper process: %v", err)
		}
	}

	b, err := os.ReadFile(counter)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(b)), strconv.Itoa((goroutines+procs)*iters); got != want {
		t.Fatalf("counter = %s, want %s: increments were lost", got, want)
	}
	type span struct {
		id         string
		start, end int64
	}
	var spans []span
	raw, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var s span
		if _, err := fmt.Sscanf(line, "%s %d %d", &s.id, &s.start, &s.end); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		spans = append(spans, s)
	}
	if len(spans) != (goroutines+procs)*iters {
		t.Fatalf("%d critical sections logged, want %d", len(spans), (goroutines+procs)*iters)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	procSeen := map[string]bool{}
	for i, s := range spans {
		procSeen[s.id] = true
		if i > 0 && s.start < spans[i-1].end {
			t.Fatalf("critical sections overlap: %+v and %+v", spans[i-1], s)
		}
	}
	for i := 0; i < procs; i++ {
		if !procSeen[fmt.Sprintf("proc-%d", i)] {
			t.Fatalf("process %d never held the lock", i)
		}
	}
}

func TestFencingTokensIncrease(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	lockers := []*lock.Etcd{newLocker(t, cli, ns, 5*time.Second, "a"), newLocker(t, cli, ns, 5*time.Second, "b")}
	ctx := context.Background()
	var first *lock.EtcdLock
	var last int64
	for i := 0; i < 50; i++ {
		l, err := lockers[i%2].Acquire(ctx, "fenced")
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("holder %d got token %d, not above the previous %d", i, l.Token(), last)
		}
		last = l.Token()
		if i == 0 {
			first = l.(*lock.EtcdLock)
			if _, err := first.Txn(ctx).Then(clientv3.OpPut("/"+ns+"/data", "first")).Commit(); err != nil {
				t.Fatalf("fenced write while holding: %v", err)
			}
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The first holder's token is stale now: etcd itself refuses the write.
	resp, err := cli.Txn(ctx).If(first.Cmp()).Then(clientv3.OpPut("/"+ns+"/data", "stale")).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("raw transaction fenced by a stale token: succeeded=%v err=%v", resp != nil && resp.Succeeded, err)
	}
	if _, err := first.Txn(ctx).Then(clientv3.OpPut("/"+ns+"/data", "stale")).Commit(); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("fenced write with a stale token: err = %v, want ErrFenced", err)
	}
	g, err := cli.Get(ctx, "/"+ns+"/data")
	if err != nil || string(g.Kvs[0].Value) != "first" {
		t.Fatalf("data = %v (%v), want the first holder's write only", g, err)
	}
}

func TestFencedTxnKeepsCallerConditions(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	l, err := newLocker(t, cli, ns, 5*time.Second, "a").Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	el := l.(*lock.EtcdLock)
	key := "/" + ns + "/data"
	resp, err := el.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", 1)).
		Then(clientv3.OpPut(key, "then")).Else(clientv3.OpPut(key, "else")).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("caller's compare should fail: succeeded=%v err=%v", resp != nil && resp.Succeeded, err)
	}
	resp, err = el.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", 1)).
		Then(clientv3.OpPut(key, "then")).Else(clientv3.OpPut(key, "else")).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("caller's compare should hold: succeeded=%v err=%v", resp != nil && resp.Succeeded, err)
	}
	if g, _ := cli.Get(ctx, key); string(g.Kvs[0].Value) != "then" || g.Kvs[0].Version != 2 {
		t.Fatalf("value %q version %d, want then at version 2", g.Kvs[0].Value, g.Kvs[0].Version)
	}
}

func TestHolderKilled(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	const ttl = 2 * time.Second
	h := startHelper(t, "hold", "H_NS="+ns, "H_LOCK=job", "H_TTL="+ttl.String(), "H_ID=victim")
	h.Line(t, "ACQUIRED")
	locker := newLocker(t, cli, ns, 5*time.Second, "survivor")
	if _, err := locker.TryAcquire(context.Background(), "job"); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("lock should be held by the helper: %v", err)
	}
	killed := time.Now()
	if err := h.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ttl+time.Second)
	defer cancel()
	l, err := locker.Acquire(ctx, "job")
	if err != nil {
		t.Fatalf("no acquisition within TTL + 1s of SIGKILL: %v", err)
	}
	t.Logf("acquired %s after SIGKILL", time.Since(killed).Round(time.Millisecond))
	_ = l.Release(context.Background())
}

func TestHolderPaused(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	const ttl = 2 * time.Second
	data := "/" + ns + "/data"
	h := startHelper(t, "hold", "H_NS="+ns, "H_LOCK=job", "H_TTL="+ttl.String(), "H_ID=sleeper", "H_DATA="+data)
	oldToken, _ := strconv.ParseInt(h.Line(t, "ACQUIRED"), 10, 64)
	if err := h.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	locker := newLocker(t, cli, ns, 5*time.Second, "successor")
	ctx, cancel := context.WithTimeout(context.Background(), ttl+2*time.Second)
	defer cancel()
	l, err := locker.Acquire(ctx, "job")
	if err != nil {
		_ = h.Cmd.Process.Signal(syscall.SIGCONT)
		t.Fatalf("no acquisition while the holder is paused: %v", err)
	}
	t.Logf("acquired %s after SIGSTOP; token %d after %d", time.Since(paused).Round(time.Millisecond), l.Token(), oldToken)
	if l.Token() <= oldToken {
		t.Fatalf("new token %d is not above the paused holder's %d", l.Token(), oldToken)
	}
	if _, err := l.(*lock.EtcdLock).Txn(ctx).Then(clientv3.OpPut(data, "successor")).Commit(); err != nil {
		t.Fatal(err)
	}
	if err := h.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Stdin.Write([]byte("WRITE\n")); err != nil {
		t.Fatal(err)
	}
	got := h.Line(t, "RESULT")
	if want := "cancelled=true lost=true raw_applied=false fenced=true"; got != want {
		t.Fatalf("paused holder after SIGCONT: %s, want %s", got, want)
	}
	if g, _ := cli.Get(context.Background(), data); string(g.Kvs[0].Value) != "successor" {
		t.Fatalf("data = %q: the paused holder's write got through", g.Kvs[0].Value)
	}
}

func TestEtcdStoppedUnderHolder(t *testing.T) {
	own, cli := etcdtest.StartOwn(t)
	const ttl = 2 * time.Second
	locker, err := lock.NewEtcd(context.Background(), cli, lock.EtcdConfig{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	l, err := locker.Acquire(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	lctx := l.Context()
	time.Sleep(ttl / 2) // let a renewal or two go through
	stopped := time.Now()
	_ = own.Close(context.Background())
	select {
	case <-lctx.Done():
	case <-time.After(2 * ttl):
		t.Fatalf("lock context still alive %s after etcd stopped", 2*ttl)
	}
	cancelled := time.Now()
	renewed := locker.Lease().Renewed()
	if late := cancelled.Sub(renewed.Add(ttl)); late > 100*time.Millisecond {
		t.Fatalf("lock context cancelled %s after last renewal + TTL", late)
	}
	if !errors.Is(context.Cause(lctx), lock.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", context.Cause(lctx))
	}
	t.Logf("etcd stopped; lock context cancelled %s later, %s after the last renewal was sent",
		cancelled.Sub(stopped).Round(time.Millisecond), cancelled.Sub(renewed).Round(time.Millisecond))
}

func TestTryAcquireHeld(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	a := newLocker(t, cli, ns, 5*time.Second, "worker-a")
	b := newLocker(t, cli, ns, 5*time.Second, "worker-b")
	la, err := a.TryAcquire(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.TryAcquire(ctx, "report")
	var held *lock.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("err = %v, want *HeldError", err)
	}
	if held.Holder.ID != "worker-a" || held.Holder.PID != os.Getpid() || held.Token != la.Token() || held.Holder.AcquiredAt.IsZero() {
		t.Fatalf("HeldError = %+v, want worker-a with token %d", held, la.Token())
	}
	if countKeys(t, cli, ns) != 1 {
		t.Fatalf("a failed try-acquire left a key behind")
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryAcquire(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d not above %d", lb.Token(), la.Token())
	}
}

func TestAcquireWaitBound(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	a := newLocker(t, cli, ns, 5*time.Second, "worker-a")
	b := newLocker(t, cli, ns, 5*time.Second, "worker-b")
	if _, err := a.Acquire(context.Background(), "report"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.Acquire(ctx, "report")
	var held *lock.HeldError
	if !errors.As(err, &held) || !errors.Is(err, context.DeadlineExceeded) || held.Holder.ID != "worker-a" {
		t.Fatalf("err = %v, want a HeldError naming worker-a that matches DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("waited %s for a 300ms bound", waited)
	}
	st, err := a.Status(context.Background(), "report")
	if err != nil || st.Waiters != 0 {
		t.Fatalf("after giving up, waiters = %d (%v), want 0", st.Waiters, err)
	}
}

func TestFIFO(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	holder := newLocker(t, cli, ns, 5*time.Second, "holder")
	l0, err := holder.Acquire(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	order := make(chan int, n)
	releaseNext := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		lk := newLocker(t, cli, ns, 5*time.Second, fmt.Sprintf("w%d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := lk.Acquire(ctx, "q")
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			<-releaseNext
			_ = l.Release(ctx)
		}()
		// Wait until waiter i is queued before starting the next one.
		for {
			st, err := holder.Status(ctx, "q")
			if err != nil {
				t.Fatal(err)
			}
			if st.Waiters == i+1 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := l0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for want := 0; want < n; want++ {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("waiter %d acquired in turn %d", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d never acquired", want)
		}
		releaseNext <- struct{}{}
	}
	wg.Wait()
}

func TestReleaseOnlyByHolder(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	a := newLocker(t, cli, ns, 5*time.Second, "a")
	b := newLocker(t, cli, ns, 5*time.Second, "b")
	la, err := a.Acquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	var nh *lock.NotHeldError
	if err := b.Release(ctx, "r", la.Token()+1); !errors.As(err, &nh) || nh.Current.Token != la.Token() {
		t.Fatalf("release with a wrong token: %v, want NotHeldError naming token %d", err, la.Token())
	}
	// Knowing the token is not enough: only the holder releases.
	if err := b.Release(ctx, "r", la.Token()); !errors.As(err, &nh) || !strings.Contains(err.Error(), "only its holder") {
		t.Fatalf("release by another locker with the right token: %v, want NotHeldError", err)
	}
	if st, _ := b.Status(ctx, "r"); !st.Held || st.Token != la.Token() {
		t.Fatalf("after another locker's release the lock is %+v", st)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := la.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
	lb, err := b.Acquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	// A retried release with the stale token must not delete the next holder.
	if err := a.Release(ctx, "r", la.Token()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("stale-token release: %v, want ErrNotHeld", err)
	}
	if st, _ := b.Status(ctx, "r"); !st.Held || st.Token != lb.Token() {
		t.Fatalf("after a stale release the lock is %+v, want held by token %d", st, lb.Token())
	}
	if err := b.Release(ctx, "r", lb.Token()); err != nil {
		t.Fatalf("release by token from the holding locker: %v", err)
	}
	select {
	case <-lb.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a lock released by token elsewhere kept its context alive")
	}
}

func TestStatusAndList(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	a := newLocker(t, cli, ns, 7*time.Second, "ops-a")
	before := time.Now().Add(-time.Second)
	l1, err := a.Acquire(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	st, err := a.Status(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if !st.Held || st.Token != l1.Token() || st.Holder.ID != "ops-a" || st.Holder.Host != host ||
		st.Holder.PID != os.Getpid() || st.Holder.AcquiredAt.Before(before) || st.TTL <= 0 || st.TTL > 7*time.Second {
		t.Fatalf("status = %+v", st)
	}
	free, err := a.Status(ctx, "gamma")
	if err != nil || free.Held {
		t.Fatalf("free lock status = %+v, %v", free, err)
	}
	list, err := a.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "alpha" || list[1].Name != "beta" {
		t.Fatalf("list = %+v", list)
	}
}

func TestLockLostWhenKeyDeleted(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	l, err := newLocker(t, cli, ns, 5*time.Second, "a").Acquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	lctx := l.Context()
	if _, err := cli.Delete(context.Background(), l.(*lock.EtcdLock).Key()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lock context alive after its key was deleted")
	}
	if !errors.Is(context.Cause(lctx), lock.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", context.Cause(lctx))
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	locker := newLocker(t, cli, ns, 5*time.Second, "a")
	for _, tc := range []struct{ name, lock string }{
		{"empty", ""},
		{"oversized", strings.Repeat("x", 129)},
		{"slash", "a/b"},
		{"space", "a b"},
		{"dotdot", ".."},
		{"unicode", "lock-é"},
		{"newline", "a\nb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for op, f := range map[string]func() error{
				"Acquire":    func() error { _, err := locker.Acquire(ctx, tc.lock); return err },
				"TryAcquire": func() error { _, err := locker.TryAcquire(ctx, tc.lock); return err },
				"Release":    func() error { return locker.Release(ctx, tc.lock, 1) },
				"Status":     func() error { _, err := locker.Status(ctx, tc.lock); return err },
			} {
				err := f()
				var ie *drover.InputError
				if !errors.As(err, &ie) || ie.Field != "name" || !strings.Contains(err.Error(), "must be 1 to 128 characters") {
					t.Fatalf("%s(%q) = %v, want an InputError naming the field and the rule", op, tc.lock, err)
				}
			}
		})
	}
	for _, ttl := range []time.Duration{500 * time.Millisecond, 25 * time.Hour, -time.Second} {
		_, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: ttl})
		if !errors.Is(err, drover.ErrInvalidInput) || !strings.Contains(err.Error(), "ttl") || !strings.Contains(err.Error(), "between 1s and 24h0m0s") {
			t.Fatalf("TTL %s: %v, want an error naming ttl and its range", ttl, err)
		}
	}
	if _, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: "a/b"}); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("namespace a/b: %v", err)
	}
	if n := countKeys(t, cli, ns); n != 0 {
		t.Fatalf("bad input wrote %d keys", n)
	}
}
