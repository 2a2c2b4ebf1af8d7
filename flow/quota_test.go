package flow_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func grantLease(t *testing.T, cli *clientv3.Client, ttl int64) clientv3.LeaseID {
	t.Helper()
	l, err := cli.Grant(context.Background(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	return l.ID
}

// TestQuotaNeverExceeded: 12 contenders with leases of their own take
// slots of a per-tenant quota of 3 as fast as they can; the holders counted
// at any moment never exceed 3, and another tenant's slots are separate.
// Idle slots go back to the fleet: a contender that stops asking lets the
// others have them.
func TestQuotaNeverExceeded(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	var holding, peak, grants atomic.Int64
	var wg sync.WaitGroup
	var contenders []*flow.Quota
	for i := range 12 {
		cli := srv.Client(t)
		lease := grantLease(t, cli, 30)
		q, err := flow.NewQuota(ctx, cli, ns, flow.PerTenant, flow.QuotaConfig{Limit: 3}, func() clientv3.LeaseID { return lease })
		if err != nil {
			t.Fatal(err)
		}
		contenders = append(contenders, q)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 30 {
				task := flow.Call{ID: fmt.Sprintf("c%d-%d", i, j), Type: "x", Tenant: "acme"}
				release, ok, err := q.Acquire(ctx, task)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				n := holding.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				grants.Add(1)
				time.Sleep(2 * time.Millisecond)
				holding.Add(-1)
				release()
			}
		}()
	}
	wg.Wait()
	for _, q := range contenders {
		q.Close(context.Background()) // gives its slots back
	}
	if peak.Load() > 3 {
		t.Fatalf("%d held a quota of 3 at once", peak.Load())
	}
	if grants.Load() < 30 {
		t.Fatalf("only %d of 360 attempts got a slot", grants.Load())
	}
	// Another tenant is not affected by acme's slots; tasks without a
	// tenant are not limited.
	cli := srv.Client(t)
	lease := grantLease(t, cli, 30)
	q, err := flow.NewQuota(ctx, cli, ns, flow.PerTenant, flow.QuotaConfig{}, func() clientv3.LeaseID { return lease })
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(context.Background())
	for i := range 3 {
		if _, ok, _ := q.Acquire(ctx, flow.Call{ID: fmt.Sprintf("acme-%d", i), Tenant: "acme"}); !ok {
			t.Fatalf("acme slot %d refused with none held", i)
		}
	}
	if _, ok, _ := q.Acquire(ctx, flow.Call{ID: "acme-4", Tenant: "acme"}); ok {
		t.Fatal("a fourth acme slot was granted")
	}
	if _, ok, _ := q.Acquire(ctx, flow.Call{ID: "globex-1", Tenant: "globex"}); !ok {
		t.Fatal("another tenant was refused")
	}
	if rel, ok, _ := q.Acquire(ctx, flow.Call{ID: "none"}); !ok || rel != nil {
		t.Fatal("a task without a tenant was limited")
	}
	// The holder's lease revoked (its worker died): the slots are free.
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	lease2 := grantLease(t, cli, 30)
	q2, err := flow.NewQuota(ctx, cli, ns, flow.PerTenant, flow.QuotaConfig{}, func() clientv3.LeaseID { return lease2 })
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close(context.Background())
	if _, ok, _ := q2.Acquire(ctx, flow.Call{ID: "acme-5", Tenant: "acme"}); !ok {
		t.Fatal("slots of a revoked lease still held")
	}
	// A subject's own limit, set live: globex may now hold only one.
	if err := flow.SetQuota(ctx, cli, ns, flow.PerTenant, "globex", 1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for q2.Config().For("globex") != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok, _ := q2.Acquire(ctx, flow.Call{ID: "globex-2", Tenant: "globex"}); !ok {
		t.Fatal("first globex slot refused")
	}
	if _, ok, _ := q2.Acquire(ctx, flow.Call{ID: "globex-3", Tenant: "globex"}); ok {
		t.Fatal("second globex slot granted over its own limit of 1")
	}
	us, err := flow.Quotas(ctx, cli, ns)
	if err != nil || len(us) != 1 || us[0].Limit != 3 || us[0].Subjects["globex"] != 1 || us[0].Held["acme"] != 1 || us[0].Held["globex"] != 1 {
		t.Fatalf("quotas: %+v %v", us, err)
	}
}
