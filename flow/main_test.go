package flow_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// srv is the embedded etcd the tests share; each test uses its own namespace.
var srv *etcdtest.Server

const helperEnv = "DROVER_FLOW_TEST_HELPER"

func TestMain(m *testing.M) {
	os.Exit(etcdtest.Main(m, &srv, helperEnv, runHelper))
}

// runHelper is a worker process for the weighted-limit test: four
// goroutines reserve estimated weights of limit H_LIMIT and settle actual
// ones (under or over the estimate); it prints the total it settled and
// closes its limiter.
func runHelper(string) int {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: strings.Split(os.Getenv("H_ENDPOINTS"), ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	seed, _ := strconv.Atoi(os.Getenv("H_SEED"))
	r, _ := flow.ParseRate("rate", "20000/s")
	r.Burst = 4000
	l, err := flow.NewLimiter(ctx, cli, os.Getenv("H_NS"), os.Getenv("H_LIMIT"), &r)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var settled atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(g)))
			for range 50 {
				est := int64(100 + rng.IntN(200))
				res, err := l.Reserve(ctx, est)
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				actual := est/2 + int64(rng.IntN(int(est)))
				res.Settle(actual)
				settled.Add(actual)
			}
		}()
	}
	wg.Wait()
	if err := l.Close(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(settled.Load())
	return 0
}
