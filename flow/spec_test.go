package flow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestParseSpecAndGates: the worker's flow control is parsed and assembled
// by the library, gates in the documented order (quotas, breakers, then
// rate limits), and bad specs name their flag.
func TestParseSpecAndGates(t *testing.T) {
	t.Parallel()
	spec, err := flow.ParseSpec([]string{"openai=500/m;burst=50;types=chat"}, []string{"tenant=2", "tenant:acme=5"}, []string{"crm;failures=3;cooldown=1m"})
	if err != nil {
		t.Fatal(err)
	}
	if l := spec.Limits[0]; l.Name != "openai" || l.Rate.Burst != 50 || l.Types[0] != "chat" {
		t.Fatalf("limit %+v", l)
	}
	if q := spec.Quotas[0]; len(spec.Quotas) != 1 || q.Config.Limit != 2 || q.Config.Subjects["acme"] != 5 {
		t.Fatalf("quotas %+v", spec.Quotas)
	}
	if b := spec.Breakers[0]; b.Config.Failures != 3 || b.Config.Cooldown != time.Minute {
		t.Fatalf("breaker %+v", b)
	}
	for _, bad := range []struct {
		l, q, b []string
		flag    string
	}{{[]string{"x"}, nil, nil, "--limit"}, {nil, []string{"tenant=0"}, nil, "--quota"}, {nil, nil, []string{"crm;failures=x"}, "--breaker"}} {
		if _, err := flow.ParseSpec(bad.l, bad.q, bad.b); !errors.Is(err, drover.ErrInvalidInput) || !strings.Contains(err.Error(), bad.flag) {
			t.Fatalf("%v %v %v: %v", bad.l, bad.q, bad.b, err)
		}
	}
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	l := grantLease(t, cli, 30)
	gates, closeAll, err := spec.Gates(context.Background(), cli, ns, func() clientv3.LeaseID { return l })
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(context.Background())
	var order []string
	for _, g := range gates {
		order = append(order, fmt.Sprintf("%T", g))
	}
	if got := strings.Join(order, " "); got != "flow.quotaGate flow.breakerGate *flow.rateGate" {
		t.Fatalf("gates in order %s", got)
	}
	closeAll(context.Background()) // twice is fine
}
