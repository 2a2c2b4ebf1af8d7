package cli_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestWorkerKilledHoldingReservation: a drover worker SIGKILLed while its
// task runs holds the task's reservation under the worker's lease; when
// the lease ends the reservation is released (nothing reserved, nothing
// used), and a second worker runs the task and settles its estimate.
func TestWorkerKilledHoldingReservation(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx := context.Background()
	const key = "openai/gpt-4.1/key-killed"
	b := budget.New(cli, ns)
	defer b.Close()
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 100, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qc.Submit(ctx, "llm", []queue.Task{{ID: "slow", Type: "chat", Metadata: queue.Metadata{Tenant: "acme", Budget: key, EstimatedTokens: 40}}}, nil); err != nil {
		t.Fatal(err)
	}
	p := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "llm", "--concurrency", "1", "--ttl", "3s", "--handler", "exec:sleep 600")...)
	poll := func(what string, cond func(budget.Usage) bool) budget.Usage {
		t.Helper()
		for i := 0; ; i++ {
			u, err := b.Get(ctx, key)
			if err == nil && cond(u) {
				return u
			}
			if i == 600 {
				t.Fatalf("after 600 polls, %s: %+v %v; worker stderr:\n%s", what, u, err, p.stderr.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	poll("the running task holds its 40 tokens", func(u budget.Usage) bool { return u.Live == 1 && u.Reserved == 40 })
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 30*time.Second)
	u := poll("the killed worker's reservation is released", func(u budget.Usage) bool { return u.Live == 0 })
	if u.Reserved != 0 || u.Used != 0 || u.Remaining != 100 {
		t.Fatalf("after the release: reserved %d, used %d, remaining %d; want 0, 0, 100", u.Reserved, u.Used, u.Remaining)
	}
	r := droverEnv(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "llm", "--concurrency", "1", "--drain", "--json", "--handler", "exec:true")...)
	if r.code != 0 {
		t.Fatalf("second worker: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
	if u, err = b.Get(ctx, key); err != nil || u.Used != 40 || u.Live != 0 || u.RequestsUsed != 2 {
		t.Fatalf("after the second worker: %+v %v; want its 40 settled, two requests", u, err)
	}
}
