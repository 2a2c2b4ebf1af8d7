package cli

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/droverhq/drover/cluster"
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
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		return nil, fmt.Errorf("store guard: %w", err)
	}
	return a.startGuards(cli, true, []guardTarget{{endpoint: srv.Endpoints()[0], quota: srv.Quota()}}, f)
}

// externalGuardTargets lists the members of an external cluster to guard:
// each member's first client URL, as its MemberList gives it. A member
// that reports no quota (etcd before 3.6 does not) is left out, and so is
// one without a client URL; a member that does not answer now is guarded
// anyway (its checks retry). Each is logged.
func (a *app) externalGuardTargets(ctx context.Context, cli *clientv3.Client) []guardTarget {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ml, err := cli.MemberList(lctx)
	if err != nil {
		a.logger.Warn("store guard off: the cluster's members could not be listed; restart the server to try again", "err", err)
		return nil
	}
	var out []guardTarget
	for _, m := range ml.Members {
		id := fmt.Sprintf("%x", m.ID)
		if len(m.ClientURLs) == 0 {
			a.logger.Warn("store guard: a member without a client URL is not guarded", "member", id, "name", m.Name)
			continue
		}
		ep := m.ClientURLs[0]
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		sr, err := cli.Status(sctx, ep)
		scancel()
		switch {
		case err != nil:
			a.logger.Warn("store guard: a member does not answer at its client URL; guarded anyway, its checks retry", "member", id, "endpoint", ep, "err", err)
		case sr.DbSizeQuota <= 0:
			a.logger.Warn("store guard: a member reports no quota (etcd before 3.6): it is not guarded", "member", id, "endpoint", ep)
			continue
		}
		out = append(out, guardTarget{endpoint: ep})
	}
	return out
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
