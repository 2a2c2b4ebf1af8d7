package fleet_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/registry"
)

// TestRegisterWorker: a Go program registers its queue worker as drover
// worker does, under the lease its claims are bound to; the entry goes with
// the runtime.
func TestRegisterWorker(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	rt, err := process.Start(ctx, cli, process.WithNamespace(ns), process.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cfg := queue.WorkerConfig{Namespace: ns, Queue: "mail", Concurrency: 3, WorkerID: "w-1", Lease: rt.Lease()}
	w, err := queue.NewWorker(ctx, cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.RegisterWorker(ctx, rt, w, cfg, time.Second); err != nil {
		t.Fatal(err)
	}
	list, _, err := registry.List(ctx, cli, ns, registry.WorkerComponent)
	if err != nil || len(list) != 1 || list[0].ID != "w-1" {
		t.Fatalf("workers %+v, %v", list, err)
	}
	var info registry.WorkerInfo
	if err := json.Unmarshal(list[0].Data, &info); err != nil || info.Queue != "mail" || info.Concurrency != 3 || info.Prefetch != 3 {
		t.Fatalf("info %+v, %v", info, err)
	}
	if err := rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if list, _, _ := registry.List(ctx, cli, ns, registry.WorkerComponent); len(list) != 0 {
		t.Fatalf("entry left after the runtime closed: %+v", list)
	}
}
