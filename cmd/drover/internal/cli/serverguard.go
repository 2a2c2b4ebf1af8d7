package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// guardTarget is an etcd member a store guard watches: a client URL of it
// and its quota in bytes (0: the one the member reports).
type guardTarget struct {
	endpoint string
	quota    int64
}

// startEmbeddedGuard starts the embedded server's store guard, over a
// client of its own, unless --store-guard=false; it returns what stops it
// (safe to call twice).
func (a *app) startEmbeddedGuard(ctx context.Context, srv *cluster.Server, f *serverFlags) (func(), error) {
	if !f.storeGuard {
		a.logger.Warn("store guard off (--store-guard=false): a queue that fills etcd's quota raises its NOSPACE alarm, which stops every lock and lease too")
		return func() {}, nil
	}
	f.admission = storeguard.NewAdmission(nil)
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		return nil, fmt.Errorf("store guard: %w", err)
	}
	return a.startGuards(cli, true, []guardTarget{{endpoint: srv.Endpoints()[0], quota: srv.Quota()}}, f)
}

// admitWrites makes the data-plane transactions of cli (the HTTP API's
// client) reserve what they add against the headroom the server's guards
// measure (storeguard.NewKV), so that a burst is refused before it passes
// the high-water mark rather than at the guard's next check. It does
// nothing with --store-guard=false. Call it before cli is shared, and
// before startExternalGuards.
func (f *serverFlags) admitWrites(cli *clientv3.Client) {
	if !f.storeGuard {
		return
	}
	if f.admission == nil {
		f.admission = storeguard.NewAdmission(nil)
	}
	cli.KV = storeguard.NewKV(cli.KV, f.admission)
}

// startExternalGuards starts, in the background, a store guard of each
// member of the external cluster cli reaches: it lists the members (again
// every 10 s until that works, so that a cluster that starts with the
// server is guarded too), then starts the guards. It returns what stops
// them (safe to call twice).
func (a *app) startExternalGuards(ctx context.Context, cli *clientv3.Client, f *serverFlags) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var stopGuards func()
	go func() {
		defer close(done)
		for logged := false; ; logged = true {
			targets, err := a.externalGuardTargets(ctx, cli)
			if err == nil {
				stop, err := a.startGuards(cli, false, targets, f)
				if err != nil {
					a.logger.Error("store guard off", "err", err)
					return
				}
				stopGuards = stop
				return
			}
			if !logged {
				a.logger.Warn("store guard: the cluster's members could not be listed; trying again every 10 s", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			if stopGuards != nil {
				stopGuards()
			}
		})
	}
}

// externalGuardTargets lists the members of an external cluster to guard,
// each through the first of its client URLs (then of the server's
// --etcd-endpoints) that answers as that member. A member that reports no
// quota (etcd before 3.6 does not) is left out; one that answers at none
// is guarded through its first client URL (its checks fail and are tried
// again until it answers). Each choice is logged.
func (a *app) externalGuardTargets(ctx context.Context, cli *clientv3.Client) ([]guardTarget, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ml, err := cli.MemberList(lctx)
	if err != nil {
		return nil, err
	}
	configured := a.clientConfig().Endpoints
	var out []guardTarget
	var names []string
	for _, m := range ml.Members {
		id := fmt.Sprintf("%x", m.ID)
		ep, quota, answered := "", int64(0), false
		for _, c := range append(slices.Clone(m.ClientURLs), configured...) {
			sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
			sr, err := cli.Status(sctx, c)
			scancel()
			if err == nil && sr.Header.MemberId == m.ID {
				ep, quota, answered = c, sr.DbSizeQuota, true
				break
			}
		}
		switch {
		case !answered && len(m.ClientURLs) == 0:
			a.logger.Warn("store guard: a member without a client URL that answers is not guarded", "member", id, "name", m.Name)
			continue
		case !answered:
			ep = m.ClientURLs[0]
			a.logger.Warn("store guard: a member answers at none of its client URLs nor --etcd-endpoints; guarded through its first, its checks retry",
				"member", id, "endpoint", ep)
		case quota <= 0:
			a.logger.Warn("store guard: a member reports no quota (etcd before 3.6): it is not guarded", "member", id, "endpoint", ep)
			continue
		}
		out = append(out, guardTarget{endpoint: ep})
		names = append(names, ep)
	}
	a.logger.Info("store guard: guarding the cluster's members", "members", len(out), "of", len(ml.Members), "endpoints", strings.Join(names, ","))
	return out, nil
}

// startGuards starts a store guard of each target on the server's
// namespace over cli, and returns what stops them (safe to call twice),
// which closes cli when own.
func (a *app) startGuards(cli *clientv3.Client, own bool, targets []guardTarget, f *serverFlags) (func(), error) {
	var guards []*cluster.Guard
	stop := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, g := range guards {
			if err := g.Close(cctx); err != nil {
				a.logger.Warn("store guard did not stop in time", "err", err)
			}
		}
		if own {
			_ = cli.Close()
		}
	}
	for _, t := range targets {
		g, err := cluster.NewGuard(cli, cluster.GuardConfig{
			Endpoint:   t.endpoint,
			Quota:      t.quota,
			Namespaces: []string{a.namespace},
			HighWater:  float64(f.highWater),
			LowWater:   float64(f.lowWater),
			Admission:  f.admission,
			Logger:     a.logger.With("member_endpoint", t.endpoint),
		})
		if err == nil {
			err = g.Start()
		}
		if err != nil {
			stop()
			return nil, fmt.Errorf("store guard of %s: %w", t.endpoint, err)
		}
		guards = append(guards, g)
	}
	var once sync.Once
	return func() { once.Do(stop) }, nil
}
