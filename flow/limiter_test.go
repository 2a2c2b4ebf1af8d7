package flow_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{"500/m": 500.0 / 60, "20/s": 20, "1000/h": 1000.0 / 3600, "10/30s": 10.0 / 30, "0.5/s": 0.5} {
		r, err := flow.ParseRate("rate", in)
		if err != nil || r.PerSecond() != want {
			t.Errorf("ParseRate(%q) = %v/s, %v; want %v/s", in, r.PerSecond(), err, want)
		}
	}
	for _, bad := range []string{"", "500", "x/m", "0/s", "-1/s", "5/fortnight", "5/0s", "1/1000h", "2e9/s"} {
		if _, err := flow.ParseRate("rate", bad); !errors.Is(err, drover.ErrInvalidInput) {
			t.Errorf("ParseRate(%q) = %v, want an input error", bad, err)
		}
	}
	if r, _ := flow.ParseRate("rate", "500/m"); r.String() != "500/m" || r.Burst != 9 {
		t.Errorf("500/m: %s burst %d", r, r.Burst)
	}
}

func newLimiter(t *testing.T, ns, name string, def *flow.Rate) *flow.Limiter {
	t.Helper()
	l, err := flow.NewLimiter(context.Background(), srv.Client(t), ns, name, def)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestWeightedUsageAddsUp: three worker processes reserve estimated weights
// of one limit (LLM tokens, say) and settle actual ones, under or over the
// estimate; once they have closed their limiters, the bucket's recorded
// usage is exactly the sum of what they settled.
func TestWeightedUsageAddsUp(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	var outs []*bytes.Buffer
	var cmds []*exec.Cmd
	for i := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=weighted", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","),
			"H_NS="+ns, "H_LIMIT=llm-tokens", fmt.Sprintf("H_SEED=%d", i))
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	var settled int64
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v", i, err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(outs[i].String()), 10, 64)
		if err != nil {
			t.Fatalf("helper %d printed %q", i, outs[i].String())
		}
		settled += n
	}
	_, used, err := flow.Usage(context.Background(), srv.Client(t), ns, "llm-tokens")
	if err != nil {
		t.Fatal(err)
	}
	if used != settled {
		t.Fatalf("recorded usage %d, settled by the three processes %d", used, settled)
	}
	t.Logf("3 processes, 600 reservations, %d tokens settled and recorded", used)
}

// TestLimiterRate: four limiters sharing 50/s (burst 50), asking for
// tokens without pause, are granted 150 in exactly (150 - burst) / 50 = 2
// seconds of their clock: the burst while the clock stands still and never
// more, then 50 for each second it moves; and they use few transactions per
// token.
func TestLimiterRate(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	r, _ := flow.ParseRate("rate", "50/s")
	clock := newFakeClock()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		l := newLimiter(t, ns, "api", &r)
		flow.SetLimiterClock(l, clock.Now)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer l.Close(context.Background())
			for {
				res, err := l.Reserve(rctx, 1)
				if err != nil {
					if rctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				granted.Add(1)
				res.Settle(1)
			}
		}()
	}
	state := keyspace.MustNew(ns).LimitState("api")
	for second := range 3 {
		want := r.Burst + int64(second)*50
		deadline := time.Now().Add(30 * time.Second)
		for granted.Load() < want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(250 * time.Millisecond) // room for a limiter to take more than it may
		if got := granted.Load(); got != want {
			t.Fatalf("%d tokens granted after %d s of the clock, want %d", got, second, want)
		}
		g, err := srv.Client(t).Get(ctx, state)
		if err != nil {
			t.Fatal(err)
		}
		var b struct{ Used int64 }
		if err := json.Unmarshal(g.Kvs[0].Value, &b); err != nil || b.Used != want {
			t.Fatalf("the bucket records %d tokens taken after %d s of the clock (%v), want %d", b.Used, second, err, want)
		}
		if second < 2 {
			clock.Add(time.Second)
		}
	}
	stop()
	wg.Wait()
	g, err := srv.Client(t).Get(ctx, state)
	if err != nil {
		t.Fatal(err)
	}
	// Version counts the bucket's writes: batches of up to 5 tokens, plus
	// the give-backs at close.
	if v := g.Kvs[0].Version; v > 150/2 {
		t.Fatalf("%d bucket writes for 150 tokens: not batched", v)
	}
}

func TestLimiterErrors(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	if _, err := flow.NewLimiter(ctx, srv.Client(t), ns, "nobody-set-it", nil); !errors.Is(err, flow.ErrNoLimit) {
		t.Fatalf("unconfigured limit: %v", err)
	}
	r, _ := flow.ParseRate("rate", "10/s")
	l := newLimiter(t, ns, "small", &r)
	defer l.Close(ctx)
	if _, err := l.Reserve(ctx, 11); !errors.Is(err, flow.ErrExceedsBurst) {
		t.Fatalf("reservation over the burst: %v", err)
	}
	// Waiting is bounded by ctx.
	for range 10 {
		res, _ := l.Reserve(ctx, 1)
		res.Settle(1)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := l.Reserve(cctx, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("reserve past ctx: %v", err)
	}
	if err := flow.SetRate(ctx, srv.Client(t), ns, "bad/name", r); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("bad name: %v", err)
	}
}

// A fleet-wide limit: each process opens a Limiter; token-weighted calls
// reserve their estimate and settle what they used.
func ExampleLimiter() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.ClientURL()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()
	rate, _ := flow.ParseRate("rate", "90000/m") // an LLM provider's tokens per minute
	lim, err := flow.NewLimiter(ctx, cli, "example-flow", "openai-tokens", &rate)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lim.Close(ctx)
	res, err := lim.Reserve(ctx, 800) // the call's estimated tokens
	if err != nil {
		fmt.Println(err)
		return
	}
	res.Settle(640) // what the response said it used
	fmt.Println(lim.Rate())
	// Output: 90000/m
}

// Limits lists every limit from one read: an untouched bucket is full, a
// used one shows what was taken, and the figures agree with Usage.
func TestLimitsListsEveryLimit(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	for name, rate := range map[string]string{"idle": "10/s", "busy": "1/h"} {
		r, err := flow.ParseRate("rate", rate)
		if err != nil {
			t.Fatal(err)
		}
		r.Burst = 50
		if err := flow.SetRate(ctx, cli, ns, name, r); err != nil {
			t.Fatal(err)
		}
	}
	l, err := flow.NewLimiter(ctx, cli, ns, "busy", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := l.Reserve(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	res.Settle(30)
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ls, err := flow.Limits(ctx, cli, ns)
	if err != nil || len(ls) != 2 {
		t.Fatalf("limits %+v, %v", ls, err)
	}
	busy, idle := ls[0], ls[1]
	if busy.Name != "busy" || busy.Used != 30 || busy.Available < 19.9 || busy.Available > 20.1 || busy.Burst != 50 || busy.Rate != "1/h" {
		t.Fatalf("busy: %+v, want 30 used, 20 available", busy)
	}
	if idle.Name != "idle" || idle.Used != 0 || idle.Available != 50 || idle.PerSecond != 10 {
		t.Fatalf("idle: %+v, want a full bucket of 50", idle)
	}
	if avail, used, err := flow.Usage(ctx, cli, ns, "busy"); err != nil || used != 30 || avail < 19.9 || avail > 20.1 {
		t.Fatalf("usage of busy: %.1f available, %d used, %v", avail, used, err)
	}
}
