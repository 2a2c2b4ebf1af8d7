package flow

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// This file is the breaker for callers that are not queue workers (the HTTP
// API): each call reads the breaker's state once and changes it by
// compare-and-swap, exactly as a worker's Breaker does, without following it
// between calls.

// GetBreaker reads breaker name's configuration and state; ErrNoBreaker when
// it has no configuration.
func GetBreaker(ctx context.Context, cli *clientv3.Client, ns, name string) (BreakerStatus, error) {
	b, err := breakerOnce(ctx, cli, ns, name)
	if err != nil {
		return BreakerStatus{}, err
	}
	return BreakerStatus{Name: name, Config: b.cfg, BreakerState: b.state}, nil
}

// AllowCall asks breaker name whether call id may go to the resource now.
// It returns the breaker's state, and nil or a *DeferError saying how
// long to hold off while the breaker is open. Past the cooldown the first
// caller becomes the half-open probe (the state's Probe is id): its outcome,
// reported with RecordCall and the same id, closes or reopens the breaker.
func AllowCall(ctx context.Context, cli *clientv3.Client, ns, name, id string) (BreakerStatus, error) {
	b, err := breakerOnce(ctx, cli, ns, name)
	if err != nil {
		return BreakerStatus{}, err
	}
	allow := b.Allow(ctx, id)
	return BreakerStatus{Name: name, Config: b.config(), BreakerState: b.State()}, allow
}

// RecordCall reports how call id went (failed or not) to breaker name, as a
// worker's handler result is reported (see Breaker.Record); with a failure
// ratio, the call is added to the window's counts at once. It returns the
// breaker after the report.
func RecordCall(ctx context.Context, cli *clientv3.Client, ns, name, id string, failed bool) (BreakerStatus, error) {
	b, err := breakerOnce(ctx, cli, ns, name)
	if err != nil {
		return BreakerStatus{}, err
	}
	if err := b.Record(ctx, id, failed); err != nil {
		return BreakerStatus{}, err
	}
	return BreakerStatus{Name: name, Config: b.config(), BreakerState: b.State()}, nil
}

// ResetCall closes breaker name for the whole fleet and clears its count,
// and returns it; ErrNoBreaker when it has no configuration.
func ResetCall(ctx context.Context, cli *clientv3.Client, ns, name string) (BreakerStatus, error) {
	b, err := breakerOnce(ctx, cli, ns, name)
	if err != nil {
		return BreakerStatus{}, err
	}
	if err := b.Reset(ctx); err != nil {
		return BreakerStatus{}, err
	}
	return BreakerStatus{Name: name, Config: b.config(), BreakerState: b.State()}, nil
}

// breakerOnce reads breaker name into a Breaker that does not follow
// changes: good for one call's check or report.
func breakerOnce(ctx context.Context, cli *clientv3.Client, ns, name string) (*Breaker, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	if err := keyspace.CheckName("breaker name", name); err != nil {
		return nil, err
	}
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(keys.BreakerConfig(name)), clientv3.OpGet(keys.BreakerState(name))).Commit()
	if err != nil {
		return nil, fmt.Errorf("flow: read breaker %s: %w", name, err)
	}
	cfgKV := resp.Responses[0].GetResponseRange().Kvs
	if len(cfgKV) == 0 {
		return nil, fmt.Errorf("%w: %s (set it with `drover breakers set %s`)", ErrNoBreaker, name, name)
	}
	done := make(chan struct{})
	close(done)
	b := newBreaker(cli, keys, name, nil)
	b.state, b.seen, b.stop, b.done = BreakerState{State: Closed}, resp.Header.Revision, func() {}, done
	if err := json.Unmarshal(cfgKV[0].Value, &b.cfg); err != nil {
		return nil, fmt.Errorf("flow: breaker %s has an unreadable configuration: %w", name, err)
	}
	if st := resp.Responses[1].GetResponseRange().Kvs; len(st) == 1 {
		_ = json.Unmarshal(st[0].Value, &b.state)
		b.mod = st[0].ModRevision
	}
	return b, nil
}
