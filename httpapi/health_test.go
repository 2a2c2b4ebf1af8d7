package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestReadyzReportsNOSPACE: with etcd's NOSPACE alarm raised and no guard
// key (no store guard ran: another writer filled the store), /readyz
// still answers 200 (the control plane works: keepalives, reads and
// deletions are accepted, and a load balancer must not drop every server
// at once), with store_full true and an alarm that names it; session
// keepalives and the purge still work; once the alarm is disarmed it says
// store_full false again. The alarm is read at most every few seconds:
// the test asks until the answer changes.
func TestReadyzReportsNOSPACE(t *testing.T) {
	t.Parallel()
	_, cli := etcdtest.QuotaServer(t, 16<<20)
	a := startAPI(t, httpapi.Config{Etcd: cli, Namespace: etcdtest.Namespace(t), Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if r := a.do("GET", "/readyz", nil).want(t, 200); r.JSON["store_full"] != false || r.JSON["alarm"] != nil {
		t.Fatalf("/readyz on an empty store: %s", r.Raw)
	}
	sess := a.session(30)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	big := strings.Repeat("x", 1<<20)
	var err error
	for i := 0; i < 40 && err == nil; i++ { // 40 MiB at most: past the 16 MiB quota
		_, err = cli.Put(ctx, fmt.Sprintf("/filler/%03d", i), big)
	}
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("filling a 16 MiB store: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	r := readyzUntil(t, a, true)
	if alarm, _ := r.JSON["alarm"].(string); !strings.Contains(alarm, "NOSPACE alarm is raised") || r.JSON["status"] != "ok" {
		t.Fatalf("/readyz under NOSPACE: %s", r.Raw)
	}
	a.do("POST", "/v1/sessions/"+sess+"/keepalive", nil).want(t, 200)
	del, err := cli.Delete(ctx, "/filler/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	// Compact and defragment, as the store guard does before it disarms:
	// with the database still past its quota, the next write of any part
	// of the server (a queue history's minute, a session) raises the alarm
	// again.
	if _, err := cli.Compact(ctx, del.Header.Revision); err != nil {
		t.Fatal(err)
	}
	for _, ep := range cli.Endpoints() {
		if _, err := cli.Defragment(ctx, ep); err != nil {
			t.Fatal(err)
		}
	}
	al, err := cli.AlarmList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range al.Alarms {
		if _, err := cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(m)); err != nil {
			t.Fatal(err)
		}
	}
	if r := readyzUntil(t, a, false); r.JSON["alarm"] != nil {
		t.Fatalf("/readyz once the alarm is disarmed: %s", r.Raw)
	}
}

// readyzUntil asks /readyz, which must answer 200, until it says
// store_full as want, and returns that answer; it fails after 200 tries
// (20 s: a bound against hanging, not a timing).
func readyzUntil(t *testing.T, a *api, want bool) resp {
	t.Helper()
	for i := 0; ; i++ {
		r := a.do("GET", "/readyz", nil).want(t, 200)
		if r.JSON["store_full"] == want {
			return r
		}
		if i == 200 {
			t.Fatalf("/readyz never said store_full %v: %s", want, r.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
