package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/process"
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
