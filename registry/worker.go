package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/process"
	clientv3 "go.etcd.io/etcd/client/v3"
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
// lease, waits for that key's deletion and tries again: a process restarted
// at once (a container keeps its host name and pid) finds its dead
// predecessor's entry, which goes within one TTL. It watches the key, so it
// registers as soon as the entry goes (lease expired or revoked, endpoint
// deregistered); should the watch end early, it tries again when the
// holder's lease would have expired. A holder that keeps its lease alive
// past twice its TTL is a live process: then the duplicate error is
// returned.
func RegisterWhenFree(ctx context.Context, rt *process.Runtime, component string, ep Endpoint) (*Registration, error) {
	return registerWhenFree(ctx, rt, component, ep, nil)
}

// waitEnd says why RegisterWhenFree stopped waiting for a held id.
type waitEnd int

const (
	waitDeleted  waitEnd = iota + 1 // the held key was deleted
	waitTimedOut                    // the holder's lease should have expired by now
	waitBroken                      // the watch ended early (compaction, no leader)
)

// maxFreeTries bounds the registrations RegisterWhenFree attempts.
const maxFreeTries = 100

// registerWhenFree is RegisterWhenFree; onWait, when not nil, is told of
// each wait before it starts (end 0, with the holder's lease) and why it
// ended.
func registerWhenFree(ctx context.Context, rt *process.Runtime, component string, ep Endpoint, onWait func(waitEnd, clientv3.LeaseID)) (*Registration, error) {
	var deadline time.Time
	backoff := 50 * time.Millisecond
	for try := 1; ; try++ {
		reg, err := Register(ctx, rt, component, ep)
		var de *DuplicateError
		if !errors.As(err, &de) || de.Self || de.Lease == 0 || try == maxFreeTries {
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
			rt.Logger().Info("endpoint id held by another lease; waiting for it to go", "component", component, "id", ep.ID, "lease", fmt.Sprintf("%x", int64(de.Lease)), "remaining", time.Duration(ttl.TTL)*time.Second)
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		if onWait != nil {
			onWait(0, de.Lease)
		}
		fallback := min(time.Duration(ttl.TTL)*time.Second+200*time.Millisecond, time.Until(deadline))
		end, werr := waitDeletion(ctx, rt.Client(), rt.Keys().Endpoint(component, ep.ID), de.CreateRevision, fallback)
		if onWait != nil {
			onWait(end, de.Lease)
		}
		if werr != nil {
			return nil, fmt.Errorf("%w (while waiting: %w)", err, werr)
		}
		if end == waitBroken { // do not spin on a watch that breaks at once
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%w (while waiting: %w)", err, ctx.Err())
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// waitDeletion waits for key, created at revision created, to be deleted,
// at most for fallback. An error is ctx's.
func waitDeletion(ctx context.Context, cli *clientv3.Client, key string, created int64, fallback time.Duration) (waitEnd, error) {
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), fallback)
	defer cancel()
	// From the creation on: a deletion before the watch opens is seen too.
	from := created + 1
	for range maxFreeTries {
		compacted := false
		for wr := range cli.Watch(wctx, key, clientv3.WithRev(from), clientv3.WithFilterPut()) {
			if wr.CompactRevision != 0 {
				compacted = true
				break
			}
			if wr.Err() != nil {
				break
			}
			if len(wr.Events) > 0 {
				return waitDeleted, nil
			}
		}
		if !compacted {
			break
		}
		// The watch fell behind a compaction: read the key instead. The
		// same key (same creation) still there is watched from now on.
		g, err := cli.Get(wctx, key)
		if err != nil {
			break
		}
		if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != created {
			return waitDeleted, nil
		}
		from = g.Header.Revision + 1
	}
	switch {
	case ctx.Err() != nil:
		return 0, ctx.Err()
	case wctx.Err() != nil:
		return waitTimedOut, nil
	}
	return waitBroken, nil
}
