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
// answers 503, a problem document with store_full true naming the alarm;
// once the alarm is disarmed it answers 200 with store_full false again.
func TestReadyzReportsNOSPACE(t *testing.T) {
	t.Parallel()
	_, cli := etcdtest.QuotaServer(t, 16<<20)
	a := startAPI(t, httpapi.Config{Etcd: cli, Namespace: etcdtest.Namespace(t), Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if r := a.do("GET", "/readyz", nil).want(t, 200); r.JSON["store_full"] != false {
		t.Fatalf("/readyz on an empty store: %s", r.Raw)
	}
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
	r := a.do("GET", "/readyz", nil).problem(t, 503)
	if r.JSON["store_full"] != true || !strings.Contains(r.str("detail"), "NOSPACE alarm is raised") ||
		r.str("type") != "https://drover.dev/problems/unready" {
		t.Fatalf("/readyz under NOSPACE: %s", r.Raw)
	}
	if _, err := cli.Delete(ctx, "/filler/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
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
	if r := a.do("GET", "/readyz", nil).want(t, 200); r.JSON["store_full"] != false {
		t.Fatalf("/readyz once the alarm is disarmed: %s", r.Raw)
	}
}
