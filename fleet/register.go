package fleet

import (
	"context"
	"encoding/json"
	"os"
	"time"

	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/registry"
)

// RegisterWorker registers queue worker w (started with cfg) as component
// "worker" (registry.WorkerComponent) under rt's primary lease, the lease
// its claims should be bound to too (cfg.Lease = rt.Lease()), so that the
// entry and the claims end together. It refreshes the worker's load every
// interval (when it changed) until rt stops. A worker restarted at once with
// the same id waits for its dead predecessor's entry to expire; a live one
// with that id is a *registry.DuplicateError.
func RegisterWorker(ctx context.Context, rt *process.Runtime, w *queue.Worker, cfg queue.WorkerConfig, interval time.Duration) error {
	host, _ := os.Hostname()
	d := registry.WorkerInfo{Queue: cfg.Queue, Concurrency: cfg.Concurrency, Prefetch: cfg.Prefetch, PID: os.Getpid(), Host: host, StartedAt: time.Now().UTC().Truncate(time.Second)}
	if d.Prefetch == 0 {
		d.Prefetch = min(cfg.Concurrency, 100)
	}
	encode := func() json.RawMessage {
		st := w.Stats()
		d.InFlight, d.Claimed, d.Succeeded, d.Failed = st.InFlight, st.Claimed, st.Succeeded, st.Retried+st.Dead
		b, _ := json.Marshal(d)
		return b
	}
	last := encode()
	reg, err := registry.RegisterWhenFree(ctx, rt, registry.WorkerComponent, registry.Endpoint{ID: w.ID(), Address: host, Data: last})
	if err != nil {
		return err
	}
	return rt.Go(func(ctx context.Context) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-reg.Done():
				return
			case <-t.C:
			}
			next := encode()
			if string(next) == string(last) {
				continue
			}
			uctx, cancel := context.WithTimeout(ctx, interval)
			err := reg.Update(uctx, next)
			cancel()
			if err == nil {
				last = next
			} else if ctx.Err() == nil {
				rt.Logger().Warn("cannot refresh the worker's registry entry", "err", err)
			}
		}
	})
}
