package lease_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// grant grants a lease that is closed when the test ends.
func grant(t *testing.T, cli *clientv3.Client, ttl time.Duration, opts ...lease.Option) *lease.Lease {
	t.Helper()
	l, err := lease.Grant(context.Background(), cli, ttl, opts...)
	if err != nil {
		t.Fatalf("grant %s: %v", ttl, err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// putBound writes key bound to l.
func putBound(t *testing.T, cli *clientv3.Client, l *lease.Lease, key string) {
	t.Helper()
	if _, err := cli.Put(context.Background(), key, "bound", clientv3.WithLease(l.ID())); err != nil {
		t.Fatalf("put %s under lease %x: %v", key, int64(l.ID()), err)
	}
}

func keyExists(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	g, err := cli.Get(context.Background(), key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return g.Count == 1
}

// grantedTTL is the TTL etcd itself holds for the lease; -1 when etcd no
// longer knows the lease.
func grantedTTL(t *testing.T, cli *clientv3.Client, id clientv3.LeaseID) (granted, remaining int64) {
	t.Helper()
	resp, err := cli.TimeToLive(context.Background(), id)
	if err != nil {
		t.Fatalf("time to live of lease %x: %v", int64(id), err)
	}
	return resp.GrantedTTL, resp.TTL
}

// renewLoops counts the goroutines that Grant started and that have not
// ended: the renewal loops. A loop that has not run yet shows up in the dump
// only by its creator.
func renewLoops() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "created by github.com/droverhq/drover/lease.Grant ")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// logBuffer collects a logger's output; the renewal goroutine writes while
// the test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records decodes every JSON log record written so far.
func (b *logBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

func TestRenewalKeepsLeaseAlive(t *testing.T) {
	cli := srv.Client(t)
	key := "/" + etcdtest.Namespace(t) + "/worker"
	granted := time.Now()
	l := grant(t, cli, time.Second)
	putBound(t, cli, l, key)

	// Hold for well past the TTL etcd granted: without renewals the key
	// would be gone before the end.
	const hold = 3500 * time.Millisecond
	serverTTL, _ := grantedTTL(t, cli, l.ID())
	t.Logf("asked for %s, etcd granted %ds", l.TTL(), serverTTL)
	if time.Duration(serverTTL)*time.Second > hold-time.Second {
		t.Fatalf("etcd granted %ds; the test must hold the lease well past that", serverTTL)
	}
	end := time.Now().Add(hold)
	for time.Now().Before(end) {
		time.Sleep(250 * time.Millisecond)
		if !keyExists(t, cli, key) {
			t.Fatalf("key bound to the lease vanished %s after the grant", time.Since(granted).Round(time.Millisecond))
		}
		if err := l.Context().Err(); err != nil {
			t.Fatalf("lease context done %s after the grant: %v", time.Since(granted).Round(time.Millisecond), context.Cause(l.Context()))
		}
	}
	if err := l.Err(); err != nil {
		t.Fatalf("Err() = %v after %s, want nil", err, hold)
	}
	if since := time.Since(l.Renewed()); since > time.Second {
		t.Fatalf("last renewal sent %s ago; renewals should come every TTL/3", since.Round(time.Millisecond))
	}
	if _, remaining := grantedTTL(t, cli, l.ID()); remaining <= 0 {
		t.Fatalf("etcd says the lease has %ds left, want > 0", remaining)
	}
}

func TestRevokedElsewhereCancelsContext(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	other := srv.Client(t)
	key := "/" + etcdtest.Namespace(t) + "/worker"
	logs := &logBuffer{}
	l := grant(t, cli, time.Second, lease.WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	putBound(t, cli, l, key)

	if _, err := other.Revoke(context.Background(), l.ID()); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	within := l.TTL()/3 + 500*time.Millisecond
	select {
	case <-l.Context().Done():
	case <-time.After(within):
		t.Fatalf("lease context still alive %s after the lease was revoked by another client", within)
	}
	t.Logf("context cancelled %s after the revoke", time.Since(revoked).Round(time.Millisecond))

	cause := context.Cause(l.Context())
	if !errors.Is(cause, lease.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", cause)
	}
	var lost *lease.LostError
	if !errors.As(cause, &lost) || lost.ID != l.ID() || lost.Cause == nil {
		t.Fatalf("cause = %#v, want a *LostError for lease %x with its cause", cause, int64(l.ID()))
	}
	if !strings.Contains(cause.Error(), fmt.Sprintf("%x", int64(l.ID()))) {
		t.Fatalf("cause %q does not name lease %x", cause, int64(l.ID()))
	}

	// Ask again once the renewal deadline has passed too, so that Err itself
	// also finds the lease lost: the loss must still be logged only once.
	time.Sleep(time.Until(l.Deadline()) + 20*time.Millisecond)
	for i := 0; i < 5; i++ {
		if err := l.Err(); err != cause {
			t.Fatalf("Err() call %d = %v, want the context's cause %v", i, err, cause)
		}
	}
	// Close waits for the renewal goroutine, so every log line is written by
	// now. A lost lease is not revoked again.
	if err := l.Close(context.Background()); err != nil {
		t.Fatalf("Close after loss: %v", err)
	}
	if got := context.Cause(l.Context()); got != cause {
		t.Fatalf("cause after Close = %v, want the loss %v kept", got, cause)
	}

	var losses []map[string]any
	for _, rec := range logs.records(t) {
		if rec["msg"] == "lease lost" {
			losses = append(losses, rec)
		}
	}
	if len(losses) != 1 {
		t.Fatalf("loss logged %d times, want once: %v", len(losses), losses)
	}
	if got, want := losses[0]["lease"], fmt.Sprintf("%x", int64(l.ID())); got != want {
		t.Fatalf("logged lease = %v, want %s", got, want)
	}
	if got, want := losses[0]["cause"], lost.Cause.Error(); got != want {
		t.Fatalf("logged cause = %v, want %q", got, want)
	}
	if keyExists(t, cli, key) {
		t.Fatal("key bound to the revoked lease still exists")
	}
}

func TestCloseRevokes(t *testing.T) {
	cli := srv.Client(t)
	key := "/" + etcdtest.Namespace(t) + "/worker"
	loops := renewLoops()
	l, err := lease.Grant(context.Background(), cli, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := renewLoops(); got != loops+1 {
		t.Fatalf("%d renewal loops running after Grant, want %d", got, loops+1)
	}
	putBound(t, cli, l, key)

	if err := l.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if keyExists(t, cli, key) {
		t.Fatal("key bound to the lease still exists right after Close")
	}
	if _, remaining := grantedTTL(t, cli, l.ID()); remaining != -1 {
		t.Fatalf("etcd still knows the lease after Close (%ds left)", remaining)
	}
	if got := renewLoops(); got != loops {
		t.Fatalf("%d renewal loops running after Close, want %d: Close must end its goroutine before returning", got, loops)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("lease context not done after Close")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, lease.ErrClosed) || errors.Is(cause, lease.ErrLost) {
		t.Fatalf("cause = %v, want ErrClosed", cause)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Err(); !errors.Is(err, lease.ErrClosed) {
		t.Fatalf("Err() after Close = %v, want ErrClosed", err)
	}
}

func TestEtcdStoppedUnderLease(t *testing.T) {
	own, cli := etcdtest.StartOwn(t)
	const ttl = 2 * time.Second
	granted := time.Now()
	l, err := lease.Grant(context.Background(), cli, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Bounded: with etcd down, revoking a lease that is not yet lost
		// waits as long as its context lets it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = l.Close(ctx)
	}()
	cancelledAt := make(chan time.Time, 1)
	defer context.AfterFunc(l.Context(), func() { cancelledAt <- time.Now() })()

	time.Sleep(ttl / 2) // let a renewal or two go through
	if !l.Renewed().After(granted) {
		t.Fatalf("no renewal within %s", ttl/2)
	}
	stopped := time.Now()
	_ = own.Close(context.Background())
	// No renewal can succeed from here on: these are final.
	deadline, renewed := l.Deadline(), l.Renewed()
	if got := deadline.Sub(renewed); got != l.TTL() {
		t.Fatalf("Deadline() - Renewed() = %s, want the TTL %s", got, l.TTL())
	}

	var at time.Time
	select {
	case at = <-cancelledAt:
	case <-time.After(ttl + 2*time.Second):
		t.Fatalf("lease context still alive %s after etcd stopped", ttl+2*time.Second)
	}
	if late := at.Sub(renewed.Add(l.TTL())); late > 100*time.Millisecond {
		t.Fatalf("context cancelled %s after last renewal + TTL", late)
	}
	if early := deadline.Sub(at); early > 50*time.Millisecond {
		t.Fatalf("context cancelled %s before the deadline, while etcd may still keep the lease", early)
	}
	cause := context.Cause(l.Context())
	var lost *lease.LostError
	if !errors.Is(cause, lease.ErrLost) || !errors.As(cause, &lost) || lost.ID != l.ID() {
		t.Fatalf("cause = %v, want a *LostError for lease %x", cause, int64(l.ID()))
	}
	if got := l.Renewed(); !got.Equal(renewed) {
		t.Fatalf("Renewed() moved from %s to %s with etcd stopped", renewed, got)
	}
	t.Logf("etcd stopped; context cancelled %s later, %s after the last renewal was sent (cause: %v)",
		at.Sub(stopped).Round(time.Millisecond), at.Sub(renewed).Round(time.Millisecond), cause)
}

func TestErr(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	other := srv.Client(t)
	ctx := context.Background()

	t.Run("lost", func(t *testing.T) {
		l := grant(t, cli, time.Second)
		if err := l.Err(); err != nil {
			t.Fatalf("Err() right after Grant = %v, want nil", err)
		}
		time.Sleep(1500 * time.Millisecond) // past the requested TTL: renewals keep it
		if err := l.Err(); err != nil {
			t.Fatalf("Err() while held = %v, want nil", err)
		}
		if _, err := other.Revoke(ctx, l.ID()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Done():
		case <-time.After(l.TTL() + time.Second):
			t.Fatal("lease not found lost after it was revoked")
		}
		err := l.Err()
		var lost *lease.LostError
		if !errors.Is(err, lease.ErrLost) || !errors.As(err, &lost) || lost.ID != l.ID() {
			t.Fatalf("Err() after loss = %v, want a *LostError for lease %x", err, int64(l.ID()))
		}
		if cause := context.Cause(l.Context()); err != cause {
			t.Fatalf("Err() = %v, context cause = %v: want the same error", err, cause)
		}
	})
	t.Run("closed", func(t *testing.T) {
		l := grant(t, cli, time.Second)
		if err := l.Err(); err != nil {
			t.Fatalf("Err() right after Grant = %v, want nil", err)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Err(); !errors.Is(err, lease.ErrClosed) {
			t.Fatalf("Err() after Close = %v, want ErrClosed", err)
		}
	})
}

func TestBadTTL(t *testing.T) {
	cli := srv.Client(t)
	ctx := context.Background()
	leases := func() map[clientv3.LeaseID]bool {
		t.Helper()
		resp, err := cli.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids := map[clientv3.LeaseID]bool{}
		for _, s := range resp.Leases {
			ids[s.ID] = true
		}
		return ids
	}
	before := leases()
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{
		{"below minimum", 500 * time.Millisecond},
		{"above maximum", 25 * time.Hour},
		{"zero", 0},
		{"negative", -time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := lease.Grant(ctx, cli, tc.ttl)
			if l != nil {
				_ = l.Close(ctx)
				t.Fatalf("Grant(%s) returned a lease", tc.ttl)
			}
			if !errors.Is(err, drover.ErrInvalidInput) {
				t.Fatalf("Grant(%s) = %v, want ErrInvalidInput", tc.ttl, err)
			}
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != "ttl" {
				t.Fatalf("Grant(%s) = %#v, want an InputError for field ttl", tc.ttl, err)
			}
			if msg := err.Error(); !strings.Contains(msg, "ttl") || !strings.Contains(msg, "between 1s and 24h0m0s") {
				t.Fatalf("message %q does not name ttl and its range", msg)
			}
		})
	}
	for id := range leases() {
		if !before[id] {
			t.Fatalf("a rejected Grant left lease %x on the server", int64(id))
		}
	}

	for _, tc := range []struct {
		name     string
		ttl, got time.Duration
	}{
		// etcd raises TTLs to its minimum (2 s by default); TTL reports
		// what it granted, which is what the deadline counts.
		{"minimum raised by etcd", time.Second, 2 * time.Second},
		{"rounded up", 1500 * time.Millisecond, 2 * time.Second},
		{"maximum", 24 * time.Hour, 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := grant(t, cli, tc.ttl)
			if l.TTL() != tc.got {
				t.Fatalf("TTL() = %s, want %s", l.TTL(), tc.got)
			}
		})
	}
}

// Grant a lease, bind a key to it, and revoke it with Close: the key goes
// with it.
func ExampleGrant() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()

	l, err := lease.Grant(ctx, cli, 10*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close(ctx)

	key := fmt.Sprintf("/example-grant-%d/workers/w1", time.Now().UnixNano())
	if _, err := cli.Put(l.Context(), key, "alive", clientv3.WithLease(l.ID())); err != nil {
		fmt.Println(err)
		return
	}
	g, err := cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ttl:", l.TTL())
	fmt.Println("held:", l.Err() == nil)
	fmt.Println("keys bound to it:", g.Count)

	if err := l.Close(ctx); err != nil {
		fmt.Println(err)
		return
	}
	g, err = cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("keys bound to it after Close:", g.Count)
	fmt.Println("cause:", context.Cause(l.Context()))
	// Output:
	// ttl: 10s
	// held: true
	// keys bound to it: 1
	// keys bound to it after Close: 0
	// cause: lease: closed
}

// Close revokes with a context that never ends; with etcd gone it must still
// return, no later than the lease's deadline, when etcd would have expired
// the lease by itself.
func TestCloseWithEtcdDownIsBounded(t *testing.T) {
	own, cli := etcdtest.StartOwn(t)
	l, err := lease.Grant(context.Background(), cli, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = own.Close(context.Background())
	deadline := l.Deadline()
	returned := make(chan error, 1)
	go func() { returned <- l.Close(context.Background()) }()
	select {
	case err := <-returned:
		if time.Now().After(deadline.Add(500 * time.Millisecond)) {
			t.Fatalf("Close returned %s after the lease deadline", time.Since(deadline))
		}
		if err == nil {
			t.Fatal("Close reported a successful revoke with etcd down")
		}
	case <-time.After(time.Until(deadline) + 5*time.Second):
		t.Fatal("Close blocked past the lease deadline with etcd down")
	}
}
