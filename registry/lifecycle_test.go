package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/registry"
)

// TestCloseTwice: the registry's long-lived components (runtime, watcher,
// router) stop with Close(ctx) error, and a second Close is harmless.
func TestCloseTwice(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	rt, err := process.Start(ctx, cli, process.WithNamespace(ns), process.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w, err := registry.Watch(ctx, cli, ns, "model")
	if err != nil {
		t.Fatal(err)
	}
	r := registry.NewRouter(w, registry.RoundRobin())
	for i := range 2 {
		for name, closer := range map[string]func(context.Context) error{"router": r.Close, "watcher": w.Close, "runtime": rt.Close} {
			if err := closer(ctx); err != nil {
				t.Fatalf("close %d of the %s: %v", i+1, name, err)
			}
		}
	}
}
