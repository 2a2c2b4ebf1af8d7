package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func noop(context.Context, *queue.Task) ([]byte, error) { return nil, nil }

// TestConfigValidate: the queue worker's fields are checked as the queue
// checks them, then the config's own; nothing is contacted.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := queue.WorkerConfig{Queue: "q"}
	for _, tc := range []struct {
		name  string
		cfg   fleet.Config
		field string // "" valid
	}{
		{"defaults", fleet.Config{Worker: ok, Handler: noop}, ""},
		{"handlers by type", fleet.Config{Worker: ok, Handlers: map[string]queue.Handler{"a": noop}}, ""},
		{"no queue", fleet.Config{Handler: noop}, "queue"},
		{"bad concurrency", fleet.Config{Worker: queue.WorkerConfig{Queue: "q", Concurrency: -1}, Handler: noop}, "concurrency"},
		{"a lease of its own", fleet.Config{Worker: queue.WorkerConfig{Queue: "q", Lease: &lease.Lease{}}, Handler: noop}, "lease"},
		{"no handler", fleet.Config{Worker: ok}, "handler"},
		{"nil handler", fleet.Config{Worker: ok, Handlers: map[string]queue.Handler{"a": nil}}, "handlers"},
		{"negative refresh", fleet.Config{Worker: ok, Handler: noop, RegistryRefresh: -time.Second}, "registry refresh"},
	} {
		err := tc.cfg.Validate()
		var ie *drover.InputError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field != "" && (!errors.As(err, &ie) || ie.Field != tc.field):
			t.Errorf("%s: %v, want an input error of field %q", tc.name, err, tc.field)
		}
	}
}

// TestWorkerLifecycle: a worker registers under its primary lease with the
// defaults filled in, a second one with its id is a duplicate (and leaves
// the first in place), losing the lease stops Run with lease.ErrLost, and Close
// is safe twice.
func TestWorkerLifecycle(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	spec, err := flow.ParseSpec(nil, []string{"tenant=2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fleet.Config{Worker: queue.WorkerConfig{Namespace: ns, Queue: "mail", WorkerID: "w-1", TTL: 2 * time.Second}, Flow: spec, Handler: noop}
	w, err := fleet.NewWorker(ctx, cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	if w.ID() != "w-1" {
		t.Fatalf("id %q", w.ID())
	}
	list, _, err := registry.List(ctx, cli, ns, registry.WorkerComponent)
	if err != nil || len(list) != 1 {
		t.Fatalf("workers %+v, %v", list, err)
	}
	var info registry.WorkerInfo
	if err := json.Unmarshal(list[0].Data, &info); err != nil || info.Queue != "mail" || info.Concurrency != fleet.DefaultConcurrency || info.Prefetch != fleet.DefaultConcurrency {
		t.Fatalf("info %+v, %v", info, err)
	}

	// Same id, other lease: refused, and its own lease revoked.
	if _, err := fleet.NewWorker(ctx, cli, cfg); !errors.Is(err, registry.ErrDuplicate) {
		t.Fatalf("second worker w-1: %v", err)
	}
	if again, _, _ := registry.List(ctx, cli, ns, registry.WorkerComponent); len(again) != 1 || again[0].Lease != list[0].Lease {
		t.Fatalf("workers after the refusal: %+v", again)
	}

	// The lease revoked under a running worker: Run stops with ErrLost.
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(ctx) }()
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(list[0].Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-runErr:
		if !errors.Is(err, lease.ErrLost) || !strings.Contains(err.Error(), "worker w-1 stopped: ") ||
			!strings.HasSuffix(err.Error(), "; its tasks are claimable by other workers") {
			t.Fatalf("run after the lease was revoked: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop within 30 s of its lease's revocation")
	}
	first := w.Close(ctx)
	if second := w.Close(ctx); second != first {
		t.Fatalf("close twice: %v, then %v", first, second)
	}
}
