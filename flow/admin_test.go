package flow_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestDeleteAndUpdateBreaker: delete removes each kind's keys and refuses a
// name that is not configured; UpdateBreaker changes what it is given and
// refuses a bad configuration without writing.
func TestDeleteAndUpdateBreaker(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	keys := keyspace.MustNew(ns)
	if err := flow.SetRate(ctx, cli, ns, "api", flow.Rate{Events: 5, Per: time.Second, Burst: 5}); err != nil {
		t.Fatal(err)
	}
	if err := flow.SetQuota(ctx, cli, ns, "tenant", "", 3); err != nil {
		t.Fatal(err)
	}
	cfg, err := flow.UpdateBreaker(ctx, cli, ns, "crm", func(c *flow.BreakerConfig) error { c.Failures = 3; return nil })
	if err != nil || cfg.Failures != 3 || cfg.Cooldown != flow.DefaultBreaker.Cooldown {
		t.Fatalf("new breaker: %+v, %v", cfg, err)
	}
	cfg, err = flow.UpdateBreaker(ctx, cli, ns, "crm", func(c *flow.BreakerConfig) error { c.Cooldown = time.Minute; return nil })
	if err != nil || cfg.Failures != 3 || cfg.Cooldown != time.Minute {
		t.Fatalf("changed breaker: %+v, %v", cfg, err)
	}
	if _, err := flow.UpdateBreaker(ctx, cli, ns, "crm", func(c *flow.BreakerConfig) error { c.Failures = 0; return nil }); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("failures 0: %v", err)
	}
	for _, d := range []struct {
		name string
		del  func(context.Context, *clientv3.Client, string, string) error
		miss error
		pre  string
	}{{"api", flow.DeleteLimit, flow.ErrNoLimit, keys.Limits()}, {"tenant", flow.DeleteQuota, flow.ErrNoQuota, keys.Quotas()}, {"crm", flow.DeleteBreaker, flow.ErrNoBreaker, keys.Breakers()}} {
		if err := d.del(ctx, cli, ns, d.name); err != nil {
			t.Fatalf("delete %s: %v", d.name, err)
		}
		if g, _ := cli.Get(ctx, d.pre, clientv3.WithPrefix(), clientv3.WithCountOnly()); g.Count != 0 {
			t.Fatalf("%d keys left under %s", g.Count, d.pre)
		}
		if err := d.del(ctx, cli, ns, d.name); !errors.Is(err, d.miss) {
			t.Fatalf("delete %s again: %v", d.name, err)
		}
	}
}

// TestSeedConfigSaysWhenEtcdWins: a limit, quota or breaker given a setting
// that differs from the one etcd has logs that etcd's wins, naming both and
// the command that changes it; the same setting logs nothing.
func TestSeedConfigSaysWhenEtcdWins(t *testing.T) {
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	var logs bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	lease := grantLease(t, cli, 30)
	for i, limit := range []int{2, 2, 5} {
		q, err := flow.NewQuota(ctx, cli, ns, "tenant", flow.QuotaConfig{Limit: limit}, func() clientv3.LeaseID { return lease })
		if err != nil {
			t.Fatal(err)
		}
		q.Close(context.Background())
		if got := strings.Count(logs.String(), "quota tenant is already configured in etcd, differently"); got != i/2 {
			t.Fatalf("after quota %d: %d notices; logs:\n%s", limit, got, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "change_with=\"drover quotas set tenant K\"") {
		t.Fatalf("no command in %s", logs.String())
	}
	for _, cfg := range []flow.BreakerConfig{{Failures: 4, Cooldown: time.Second}, {Failures: 9, Cooldown: time.Second}} {
		b, err := flow.NewBreaker(ctx, cli, ns, "crm", &cfg)
		if err != nil {
			t.Fatal(err)
		}
		b.Close(context.Background())
	}
	lim, err := flow.NewLimiter(ctx, cli, ns, "api", &flow.Rate{Events: 1, Per: time.Second, Burst: 1}, flow.WithLimiterLogger(slog.Default()))
	if err != nil {
		t.Fatal(err)
	}
	_ = lim.Close(ctx)
	lim, err = flow.NewLimiter(ctx, cli, ns, "api", &flow.Rate{Events: 2, Per: time.Second, Burst: 2}, flow.WithLimiterLogger(slog.Default()))
	if err != nil {
		t.Fatal(err)
	}
	_ = lim.Close(ctx)
	for _, want := range []string{"breaker crm is already configured in etcd, differently", "limit api is already configured in etcd, differently"} {
		if strings.Count(logs.String(), want) != 1 {
			t.Fatalf("want one %q in:\n%s", want, logs.String())
		}
	}
}

// TestCloseTwice: quotas, breakers and limiters stop with Close(ctx) error,
// and a second Close is harmless.
func TestCloseTwice(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	lease := grantLease(t, cli, 30)
	q, err := flow.NewQuota(ctx, cli, ns, "q", flow.QuotaConfig{Limit: 1}, func() clientv3.LeaseID { return lease })
	if err != nil {
		t.Fatal(err)
	}
	b, err := flow.NewBreaker(ctx, cli, ns, "b", &flow.DefaultBreaker)
	if err != nil {
		t.Fatal(err)
	}
	l, err := flow.NewLimiter(ctx, cli, ns, "l", &flow.Rate{Events: 1, Per: time.Second, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		for name, closer := range map[string]func(context.Context) error{"quota": q.Close, "breaker": b.Close, "limiter": l.Close} {
			if err := closer(ctx); err != nil {
				t.Fatalf("close %d of the %s: %v", i+1, name, err)
			}
		}
	}
}
