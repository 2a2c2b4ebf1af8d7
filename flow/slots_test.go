package flow_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestSlotSubject: quotas tenant and type need a subject, a shared resource
// takes none; tenants are escaped for keys.
func TestSlotSubject(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		quota, subject, want string // want "": refused
	}{
		{flow.PerTenant, "acme", "acme"},
		{flow.PerTenant, "acme/eu", "acme%2Feu"},
		{flow.PerTenant, "", ""},
		{flow.PerTenant, strings.Repeat("a", 129), ""},
		{flow.PerType, "chat", "chat"},
		{flow.PerType, "", ""},
		{flow.PerType, "a/b", ""},
		{"warehouse", "", "-"},
		{"warehouse", "-", "-"},
		{"warehouse", "acme", ""},
	} {
		got, err := flow.SlotSubject(tc.quota, tc.subject)
		if tc.want == "" {
			if !errors.Is(err, drover.ErrInvalidInput) {
				t.Errorf("%s/%q: %q, %v; want an input error", tc.quota, tc.subject, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s/%q: %q, %v; want %q", tc.quota, tc.subject, got, err, tc.want)
		}
	}
}

// TestSlotDecisions: slots taken one by one under leases are granted up to
// the subject's limit across leases, per subject; a release frees one for
// another lease; a lease that holds none is told so.
func TestSlotDecisions(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	if _, err := flow.AcquireSlot(ctx, cli, ns, flow.PerTenant, "acme", grantLease(t, cli, 30)); !errors.Is(err, flow.ErrNoQuota) {
		t.Fatalf("a quota nobody set: %v", err)
	}
	if err := flow.SetQuota(ctx, cli, ns, flow.PerTenant, "", 2); err != nil {
		t.Fatal(err)
	}
	a, b := grantLease(t, cli, 30), grantLease(t, cli, 30)
	acquire := func(subject string, l int64, granted bool, inUse, held int) {
		t.Helper()
		res, err := flow.AcquireSlot(ctx, cli, ns, flow.PerTenant, subject, clientLease(l))
		if err != nil || res.Granted != granted || res.InUse != inUse || res.Held != held || res.Limit != 2 {
			t.Fatalf("acquire %s: %+v, %v; want granted %v, %d in use, %d held", subject, res, err, granted, inUse, held)
		}
	}
	acquire("acme", int64(a), true, 1, 1)
	acquire("acme", int64(b), true, 2, 1)
	acquire("acme", int64(b), false, 2, 1)
	acquire("globex", int64(b), true, 1, 1)
	res, err := flow.ReleaseSlot(ctx, cli, ns, flow.PerTenant, "acme", a)
	if err != nil || res.Held != 0 || res.InUse != 1 {
		t.Fatalf("release: %+v, %v", res, err)
	}
	if _, err := flow.ReleaseSlot(ctx, cli, ns, flow.PerTenant, "acme", a); !errors.Is(err, flow.ErrNoSlot) {
		t.Fatalf("release of a slot not held: %v", err)
	}
	acquire("acme", int64(b), true, 2, 2)
}

func clientLease(id int64) clientv3.LeaseID { return clientv3.LeaseID(id) }
