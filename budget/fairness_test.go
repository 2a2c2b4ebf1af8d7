package budget_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestFairnessByWeight: two tenants of weights 1 and 3 that both ask for
// more than the budget get 25 % and 75 % of its tokens, counted by the
// admissions of windows the test turns by hand; neither starves in any
// window.
func TestFairnessByWeight(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 1000, WindowSeconds: 60, Weights: map[string]float64{"light": 1, "heavy": 3}},
		budget.WithClock(clk.Now))
	got := map[string]int64{}
	rng := rand.New(rand.NewPCG(1, 2))
	for w := range 12 {
		perWindow := map[string]int64{}
		refused := map[string]bool{}
		for range 400 { // bounded: 1000 tokens in steps of at least 5
			if refused["light"] && refused["heavy"] {
				break
			}
			tenant := []string{"light", "heavy"}[rng.IntN(2)] // both ask, in random order
			est := int64(5 + rng.IntN(20))
			r, err := c.Reserve(ctx, key, tenant, est)
			if errors.Is(err, drover.ErrDeferred) {
				refused[tenant] = true
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Settle(ctx, r, est, nil); err != nil {
				t.Fatal(err)
			}
			perWindow[tenant] += est
		}
		if perWindow["light"] == 0 || perWindow["heavy"] == 0 {
			t.Fatalf("window %d: a tenant starved: %v", w, perWindow)
		}
		if w > 0 { // the first window admits a tenant before the other has asked
			got["light"] += perWindow["light"]
			got["heavy"] += perWindow["heavy"]
		}
		clk.Add(time.Minute)
	}
	share := float64(got["light"]) / float64(got["light"]+got["heavy"])
	t.Logf("light %d, heavy %d tokens: light's share %.3f", got["light"], got["heavy"], share)
	if share < 0.20 || share > 0.30 {
		t.Fatalf("light's share %.3f, want 0.25 within 5 points", share)
	}
	if total := got["light"] + got["heavy"]; total < 11*950 {
		t.Fatalf("%d tokens admitted in 11 windows of 1000: the budget was not used", total)
	}
}

// TestIdleShareIsUsed: a tenant alone uses the whole budget; its share is
// only set aside for others while they ask.
func TestIdleShareIsUsed(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 100, WindowSeconds: 60, Weights: map[string]float64{"light": 1, "heavy": 3}},
		budget.WithClock(clk.Now))
	for i := range 10 {
		if _, err := c.Reserve(ctx, key, "light", 10); err != nil {
			t.Fatalf("reservation %d of a tenant alone: %v", i, err)
		}
	}
}

// TestConcurrentSettlers: many clients (separate etcd connections, as
// separate workers) reserve and settle at once; the budget's used tokens
// are exactly the sum of what they settled.
func TestConcurrentSettlers(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	ns := etcdtest.Namespace(t)
	admin := budget.New(srv.Client(t), ns, budget.WithClock(clk.Now))
	defer admin.Close()
	if _, err := admin.Set(ctx, budget.Budget{Key: key, Tokens: 100_000_000, WindowSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	const workers, each = 4, 20
	var mu sync.Mutex
	var settled, count int64
	var wg sync.WaitGroup
	errs := make(chan error, workers*4)
	for w := range workers {
		c := budget.New(srv.Client(t), ns, budget.WithClock(clk.Now))
		defer c.Close()
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), uint64(g)))
				for range each {
					est := int64(100 + rng.IntN(900))
					r, err := c.Reserve(ctx, key, fmt.Sprintf("t%d", g), est)
					if err != nil {
						errs <- err
						return
					}
					actual := est/2 + int64(rng.IntN(int(est))) // ±50 %
					if _, err := c.Settle(ctx, r, actual, nil); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					settled += actual
					count++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s, err := admin.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if s.Used != settled || s.Reserved != 0 || s.RequestsUsed != count || s.Live != 0 {
		t.Fatalf("budget counts used %d, reserved %d, requests %d; the settlers settled %d tokens in %d requests",
			s.Used, s.Reserved, s.RequestsUsed, settled, count)
	}
	var perTenant int64
	for _, u := range s.TenantUsage {
		perTenant += u.Used
	}
	if perTenant != settled {
		t.Fatalf("tenants' used tokens sum to %d, want %d", perTenant, settled)
	}
}

// TestKilledHolderReleased: a process SIGKILLed while it holds a
// reservation releases it when its session lease ends, and the reservation
// can no longer be settled.
func TestKilledHolderReleased(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	c := budget.New(cli, ns, budget.WithClock(newFakeClock().Now)) // the holder's clock too: one window
	defer c.Close()
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=hold", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","),
		"H_NS="+ns, "H_KEY="+key, "H_TTL=5", "H_ESTIMATE=700")
	stdin, _ := cmd.StdinPipe()
	defer stdin.Close()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var id string
	if _, err := fmt.Fscanln(out, &id); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the holder printed no reservation: %v", err)
	}
	s, err := c.Get(ctx, key)
	if err != nil || s.Reserved != 700 || s.Live != 1 {
		t.Fatalf("with the holder alive: %+v %v", s, err)
	}
	if _, err := c.Reserve(ctx, key, "other", 400); !errors.Is(err, drover.ErrDeferred) {
		t.Fatalf("400 more while 700 of 1000 are held: %v, want a deferral", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// The lease's TTL is 5s (long enough for the live holder's keepalive on
	// a loaded machine); etcd ends it within a few seconds more. Wait for the reservation's key to go, bounded.
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for s.Live != 0 {
		select {
		case <-wctx.Done():
			t.Fatalf("the killed holder's reservation is still held after 60s: %+v", s)
		case <-time.After(200 * time.Millisecond):
		}
		if s, err = c.Get(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if s.Reserved != 0 || s.Used != 0 {
		t.Fatalf("after the holder's lease ended: %+v", s)
	}
	if _, err := c.Settle(ctx, budget.Reservation{ID: id, Budget: key}, 10, nil); !errors.Is(err, budget.ErrNotReserved) {
		t.Fatalf("settle of the released reservation: %v, want ErrNotReserved", err)
	}
	r, err := c.Reserve(ctx, key, "other", 400)
	if err != nil {
		t.Fatalf("400 after the release: %v", err)
	}
	_, _ = c.Settle(ctx, r, 400, nil)
}

// TestTTLReservation: a reservation with a lease of its own (as the HTTP
// API makes them) is released when that lease ends unsettled, and a settle
// revokes the lease of one that is settled.
func TestTTLReservation(t *testing.T) {
	ctx := context.Background()
	cli := srv.Client(t)
	c := budget.New(cli, etcdtest.Namespace(t), budget.WithClock(newFakeClock().Now)) // no window turns mid-test
	defer c.Close()
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	settled, err := c.Reserve(ctx, key, "acme", 100, budget.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, key, "acme", 200, budget.WithTTL(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, settled, 100, nil); err != nil {
		t.Fatal(err)
	}
	var id int64
	fmt.Sscanf(settled.Lease, "%x", &id)
	if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(id)); err != nil || ttl.TTL != -1 {
		t.Fatalf("the settled reservation's lease: %+v %v, want it revoked", ttl, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		s, err := c.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if s.Live == 0 {
			if s.Reserved != 0 || s.Used != 100 {
				t.Fatalf("after the unsettled lease ended: %+v", s)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the 1 s reservation is still held after a minute: %+v", s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
