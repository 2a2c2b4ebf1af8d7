package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/paxos"
	"github.com/droverhq/drover/paxos/client"
)

func newTestClient(t *testing.T, endpoints ...string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(t.Context()) })
	return c
}

// TestClientOperations runs every lock call against a real node and
// checks the typed errors: *client.HeldError with the holder, *client.NotHeldError with
// the current holder, client.ErrNotFound.
func TestClientOperations(t *testing.T) {
	t.Parallel()
	_, srv := singleNode(t)
	c := newTestClient(t, srv.URL)
	ctx := context.Background()
	li, err := c.Acquire(ctx, "job", client.AcquireRequest{Owner: "a", TTL: 10 * time.Second, Holder: json.RawMessage(`{"id":"w1"}`)})
	if err != nil || li.Token == 0 || li.Owner != "a" || string(li.Holder) != `{"id":"w1"}` {
		t.Fatalf("acquire: %+v, %v", li, err)
	}
	_, err = c.Acquire(ctx, "job", client.AcquireRequest{Owner: "b", TTL: time.Second})
	var held *client.HeldError
	if !errors.As(err, &held) || !errors.Is(err, client.ErrHeld) || held.Holder.Owner != "a" || held.Holder.Token != li.Token {
		t.Fatalf("acquire of a held lock: %v", err)
	}
	got, err := c.Get(ctx, "job")
	if err != nil || got.Owner != "a" || got.Token != li.Token || got.TTL <= 9 || got.TTL > 10 {
		t.Fatalf("get: %+v, %v", got, err)
	}
	if _, err := c.Get(ctx, "other"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get of a free lock: %v", err)
	}
	r, err := c.Renew(ctx, "job", "a", li.Token, 20*time.Second)
	if err != nil || r.Expires < li.Expires+9000 {
		t.Fatalf("renew: %+v, %v (acquired expiring %d)", r, err, li.Expires)
	}
	var nh *client.NotHeldError
	if _, err := c.Renew(ctx, "job", "b", li.Token, time.Second); !errors.As(err, &nh) || nh.Current == nil || nh.Current.Owner != "a" {
		t.Fatalf("renew by another owner: %v", err)
	}
	if err := c.Release(ctx, "job", "a", li.Token+1); !errors.As(err, &nh) || !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("release with a wrong token: %v", err)
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 || list[0].LockID != "job" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if err := c.Release(ctx, "job", "a", li.Token); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := c.Release(ctx, "job", "a", li.Token); !errors.As(err, &nh) || nh.Current != nil {
		t.Fatalf("release of a free lock: %v", err)
	}
	if st, err := c.Status(ctx); err != nil || st.Commit == 0 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if _, err := c.Acquire(ctx, "bad name", client.AcquireRequest{Owner: "a", TTL: time.Second}); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("acquire with a bad name: %v", err)
	}
}

// TestClientFailover checks the client moves on from endpoints that
// refuse connections or are stopping (503), and stays on an endpoint that
// answered 409 (another node would answer the same).
func TestClientFailover(t *testing.T) {
	t.Parallel()
	_, a := singleNode(t)
	_, b := singleNode(t)
	stopped, s := singleNode(t)
	_ = stopped.Stop()
	dead := "http://" + freeAddr(t)
	ctx := context.Background()

	c := newTestClient(t, dead, s.URL, a.URL, b.URL)
	li, err := c.Acquire(ctx, "x", client.AcquireRequest{Owner: "me", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("acquire past a dead and a stopped endpoint: %v", err)
	}
	if _, err := newTestClient(t, a.URL).Get(ctx, "x"); err != nil {
		t.Fatalf("the lock is not on the first live endpoint: %v", err)
	}
	// a answers 409 now: no failover to b, where "x" is free.
	if _, err := c.Acquire(ctx, "x", client.AcquireRequest{Owner: "you", TTL: time.Second}); !errors.Is(err, client.ErrHeld) {
		t.Fatalf("second acquire: %v, want client.ErrHeld from the same endpoint", err)
	}
	if err := c.Release(ctx, "x", "me", li.Token); err != nil {
		t.Fatal(err)
	}
	_, err = newTestClient(t, dead, "http://"+freeAddr(t)).Status(ctx)
	if !errors.Is(err, client.ErrUnreachable) || !strings.Contains(err.Error(), strings.TrimPrefix(dead, "http://")) {
		t.Fatalf("no live endpoint: %v", err)
	}
}

// TestClientLostAnswer checks that a request whose answer is lost (the
// connection cut after the node applied it) is sent again elsewhere with
// the same Idempotency-Key and applied once.
func TestClientLostAnswer(t *testing.T) {
	t.Parallel()
	_, srv := singleNode(t)
	api := srv.Config.Handler
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.ServeHTTP(httptest.NewRecorder(), r) // applied; the answer is lost
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	defer cut.Close()
	c := newTestClient(t, cut.URL, srv.URL)
	li, err := c.Acquire(context.Background(), "once", client.AcquireRequest{Owner: "me", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("acquire whose first answer was lost: %v", err)
	}
	got, err := newTestClient(t, srv.URL).Get(context.Background(), "once")
	if err != nil || got.Token != li.Token || got.Owner != "me" {
		t.Fatalf("the retried acquire was applied twice or not at all: %+v %v, answered %+v", got, err, li)
	}
}

// TestClientSkipsMinorityNode checks a client whose first endpoint is cut
// off from its group's majority gets its answer from the next endpoint
// within its deadline.
func TestClientSkipsMinorityNode(t *testing.T) {
	t.Parallel()
	peers := []paxos.Peer{{ID: 0}, {ID: 1, Addr: freeAddr(t)}, {ID: 2, Addr: freeAddr(t)}}
	_, minority := startAPINode(t, peers, paxos.APIConfig{RequestTimeout: 10 * time.Second})
	_, healthy := singleNode(t)
	c := newTestClient(t, minority.URL, healthy.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Acquire(ctx, "x", client.AcquireRequest{Owner: "o", TTL: time.Second}); err != nil {
		t.Fatalf("acquire past a node without quorum: %v", err)
	}
}

// TestClientTimeout checks a 504 is client.ErrTimeout.
func TestClientTimeout(t *testing.T) {
	t.Parallel()
	peers := []paxos.Peer{{ID: 0}, {ID: 1, Addr: freeAddr(t)}, {ID: 2, Addr: freeAddr(t)}}
	_, srv := startAPINode(t, peers, paxos.APIConfig{RequestTimeout: 200 * time.Millisecond})
	_, err := newTestClient(t, srv.URL).Acquire(context.Background(), "x", client.AcquireRequest{Owner: "o", TTL: time.Second})
	var apiErr *client.APIError
	if !errors.Is(err, client.ErrTimeout) || !errors.As(err, &apiErr) || apiErr.StatusCode != 504 {
		t.Fatalf("no quorum: %v, want client.ErrTimeout", err)
	}
}

// TestClientGoesToTheLeader starts a group of three, each node's API on
// its direct transport's address, and checks that a client whose first
// endpoint is a follower sends its next requests to the leader, which
// every answer names (client.LeaderHeader), and that the follower then serves
// none of them.
func TestClientGoesToTheLeader(t *testing.T) {
	t.Parallel()
	nodes, srvs := startAPIGroup(t, 3)
	var leader int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader known to every node")
		}
		addr := nodes[0].LeaderAddr()
		if addr == "" || addr != nodes[1].LeaderAddr() || addr != nodes[2].LeaderAddr() {
			continue
		}
		for i, s := range srvs {
			if s.Listener.Addr().String() == addr {
				leader = i
			}
		}
		break
	}
	follower := (leader + 1) % 3
	c := newTestClient(t, srvs[follower].URL, srvs[(leader+2)%3].URL, srvs[leader].URL)
	ctx := context.Background()
	li, err := c.Acquire(ctx, "x", client.AcquireRequest{Owner: "me", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := client.NextEndpoint(c); got != srvs[leader].URL || nodes[follower].LeaderAddr() != srvs[leader].Listener.Addr().String() {
		t.Fatalf("after an answer naming the leader, the client's next endpoint is %s, want %s (the leader)", got, srvs[leader].URL)
	}
	before := nodes[follower].proposals.Load()
	for range 5 {
		if _, err := c.Get(ctx, "x"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Release(ctx, "x", "me", li.Token); err != nil {
		t.Fatal(err)
	}
	if n := nodes[follower].proposals.Load() - before; n != 0 {
		t.Fatalf("the follower served %d requests after the client learned the leader", n)
	}
	resp, err := srvs[follower].Client().Get(srvs[follower].URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if got := resp.Header.Get(client.LeaderHeader); got != srvs[leader].Listener.Addr().String() {
		t.Fatalf("the follower's answer names %q as the leader, want %s", got, srvs[leader].Listener.Addr())
	}
}
