package budget_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// settleHelper reserves and settles H_COUNT calls of budget H_KEY on four
// goroutines, with estimates and a ±50 % actual usage drawn from H_SEED,
// and prints the tokens it settled and the calls: "settled N calls M".
func settleHelper(ctx context.Context, b *budget.Client) int {
	var count, seed int
	fmt.Sscan(os.Getenv("H_COUNT"), &count)
	fmt.Sscan(os.Getenv("H_SEED"), &seed)
	var mu sync.Mutex
	var settled, calls int64
	var wg sync.WaitGroup
	failed := false
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(g)))
			for range count / 4 {
				est := int64(100 + rng.IntN(900))
				r, err := b.Reserve(ctx, os.Getenv("H_KEY"), fmt.Sprintf("t%d", g), est)
				if err == nil {
					actual := est/2 + rng.Int64N(est+1)
					if _, err = b.Settle(ctx, r, actual, nil); err == nil {
						mu.Lock()
						settled, calls = settled+actual, calls+1
						mu.Unlock()
						continue
					}
				}
				fmt.Fprintln(os.Stderr, err)
				mu.Lock()
				failed = true
				mu.Unlock()
				return
			}
		})
	}
	wg.Wait()
	if failed {
		return 2
	}
	fmt.Printf("settled %d calls %d\n", settled, calls)
	return 0
}

// TestSettlerProcesses: six processes (each its own etcd connection and
// client, four goroutines each) reserve and settle one budget at once;
// the budget's used tokens and requests are exactly the sums the
// processes report, and no reservation is left.
func TestSettlerProcesses(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	admin := budget.New(srv.Client(t), ns, budget.WithClock(newFakeClock().Now))
	defer admin.Close()
	if _, err := admin.Set(ctx, budget.Budget{Key: key, Tokens: 100_000_000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	const procs, each = 6, 24
	cmds := make([]*exec.Cmd, procs)
	outs := make([]strings.Builder, procs)
	for i := range cmds {
		cmds[i] = exec.Command(os.Args[0], "-test.run=^$")
		cmds[i].Env = append(os.Environ(), helperEnv+"=settle", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","),
			"H_NS="+ns, "H_KEY="+key, "H_TTL=10", fmt.Sprintf("H_COUNT=%d", each), fmt.Sprintf("H_SEED=%d", i))
		cmds[i].Stdout, cmds[i].Stderr = &outs[i], os.Stderr
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	var settled, calls int64
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("settler %d: %v", i, err)
		}
		var s, c int64
		if _, err := fmt.Sscanf(outs[i].String(), "settled %d calls %d", &s, &c); err != nil || c != each {
			t.Fatalf("settler %d printed %q: %v", i, outs[i].String(), err)
		}
		settled, calls = settled+s, calls+c
	}
	u, err := admin.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if u.Used != settled || u.RequestsUsed != calls || u.Reserved != 0 || u.Live != 0 {
		t.Fatalf("budget counts used %d, requests %d, reserved %d, live %d; the processes settled %d tokens in %d calls",
			u.Used, u.RequestsUsed, u.Reserved, u.Live, settled, calls)
	}
}
