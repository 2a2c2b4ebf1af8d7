package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/queue"
)

// WorkerComponent is the component every queue worker registers as.
const WorkerComponent = "worker"

// WorkerInfo is what a queue worker publishes about itself in the registry:
// its settings, its load (refreshed), and where it runs.
type WorkerInfo struct {
	Queue       string    `json:"queue"`
	Concurrency int       `json:"concurrency"`
	Prefetch    int       `json:"prefetch"`
	InFlight    int64     `json:"in_flight"`
	Claimed     int64     `json:"claimed"`
	Succeeded   int64     `json:"succeeded"`
	Failed      int64     `json:"failed"`
	PID         int       `json:"pid"`
	Host        string    `json:"host"`
	StartedAt   time.Time `json:"started_at"`
}

// RegisterWorker registers queue worker w (started with cfg) as component
// "worker" under rt's primary lease, the lease its claims should be bound to
// too (cfg.Lease = rt.Lease()), so that the entry and the claims end
// together. It refreshes the worker's load every interval (when it changed)
// until rt stops. A worker restarted at once with the same id waits for its
// dead predecessor's entry to expire; a live one with that id is a
// *DuplicateError.
func RegisterWorker(ctx context.Context, rt *process.Runtime, w *queue.Worker, cfg queue.WorkerConfig, interval time.Duration) error {
	host, _ := os.Hostname()
	d := WorkerInfo{Queue: cfg.Queue, Concurrency: cfg.Concurrency, Prefetch: cfg.Prefetch, PID: os.Getpid(), Host: host, StartedAt: time.Now().UTC().Truncate(time.Second)}
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
	reg, err := RegisterWhenFree(ctx, rt, WorkerComponent, Endpoint{ID: w.ID(), Address: host, Data: last})
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

// RegisterWhenFree registers ep and, when its id is held under another
// lease, waits for that lease to expire and tries again: a process restarted
// at once (a container keeps its host name and pid) finds its dead
// predecessor's entry, which goes within one TTL. A holder that keeps its
// lease alive past twice its TTL is a live process: then the duplicate error
// is returned.
func RegisterWhenFree(ctx context.Context, rt *process.Runtime, component string, ep Endpoint) (*Registration, error) {
	var deadline time.Time
	for {
		reg, err := Register(ctx, rt, component, ep)
		var de *DuplicateError
		if !errors.As(err, &de) || de.Self || de.Lease == 0 {
			return reg, err
		}
		ttl, err2 := rt.Client().TimeToLive(ctx, de.Lease)
		if err2 != nil {
			return nil, err
		}
		if ttl.TTL < 0 { // expired between the two calls
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(2*time.Duration(ttl.GrantedTTL)*time.Second + time.Second)
			rt.Logger().Info("endpoint id held by another lease; waiting for it to expire", "component", component, "id", ep.ID, "lease", fmt.Sprintf("%x", int64(de.Lease)), "remaining", time.Duration(ttl.TTL)*time.Second)
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(min(time.Duration(ttl.TTL)*time.Second+200*time.Millisecond, time.Until(deadline))):
		}
	}
}
