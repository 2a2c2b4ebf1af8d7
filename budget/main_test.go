package budget_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// srv is the embedded etcd the tests share; each test uses its own namespace.
var srv *etcdtest.Server

const helperEnv = "DROVER_BUDGET_TEST_HELPER"

func TestMain(m *testing.M) {
	os.Exit(etcdtest.Main(m, &srv, helperEnv, runHelper))
}

// runHelper is a holder process (mode "hold"), or a settler (mode
// "settle", settleHelper): it reserves H_ESTIMATE tokens of budget
// H_KEY under a session lease of H_TTL seconds, prints the reservation id,
// and then waits for stdin to close (the test SIGKILLs it first). Its clock
// is the tests' fixed one, so that it counts in the test's window whatever
// the time of day.
func runHelper(mode string) int {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: strings.Split(os.Getenv("H_ENDPOINTS"), ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	var ttl int
	var est int64
	fmt.Sscan(os.Getenv("H_TTL"), &ttl)
	fmt.Sscan(os.Getenv("H_ESTIMATE"), &est)
	b := budget.New(cli, os.Getenv("H_NS"), budget.WithSessionTTL(ttl), budget.WithClock(newFakeClock().Now))
	defer b.Close()
	if mode == "settle" {
		return settleHelper(ctx, b)
	}
	r, err := b.Reserve(ctx, os.Getenv("H_KEY"), "acme", est)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(r.ID)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
}

// Now returns the clock's time.
func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock by d.
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
