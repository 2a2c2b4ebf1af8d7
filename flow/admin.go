package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/kv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNoBreaker: no breaker of that name is configured.
var ErrNoBreaker = errors.New("flow: breaker not configured")

// DeleteLimit removes rate limit name: its configuration and its bucket.
// Workers that name it with a default create it again when they start;
// running ones keep their last rate until they stop. ErrNoLimit when it
// was not configured.
func DeleteLimit(ctx context.Context, cli *clientv3.Client, ns, name string) error {
	keys, err := keyspace.New(ns)
	if err != nil {
		return err
	}
	return deleteConfigured(ctx, cli, "limit", name, keys.LimitConfig(name), keys.Limit(name), ErrNoLimit)
}

// DeleteQuota removes quota name: its limits, grants and ledgers. Workers
// that hold its slots keep running those tasks. ErrNoQuota when it was not
// configured.
func DeleteQuota(ctx context.Context, cli *clientv3.Client, ns, name string) error {
	keys, err := keyspace.New(ns)
	if err != nil {
		return err
	}
	return deleteConfigured(ctx, cli, "quota", name, keys.QuotaConfig(name), keys.Quota(name), ErrNoQuota)
}

// DeleteBreaker removes breaker name: its configuration and state.
// ErrNoBreaker when it was not configured.
func DeleteBreaker(ctx context.Context, cli *clientv3.Client, ns, name string) error {
	keys, err := keyspace.New(ns)
	if err != nil {
		return err
	}
	return deleteConfigured(ctx, cli, "breaker", name, keys.BreakerConfig(name), keys.Breaker(name), ErrNoBreaker)
}

// deleteConfigured deletes every key under prefix in one transaction that
// requires the configuration key config to exist.
func deleteConfigured(ctx context.Context, cli *clientv3.Client, kind, name, config, prefix string, missing error) error {
	if err := keyspace.CheckName(kind+" name", name); err != nil {
		return err
	}
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(config), ">", 0)).
		Then(clientv3.OpDelete(prefix, clientv3.WithPrefix())).Commit()
	if err != nil {
		return fmt.Errorf("flow: delete %s %s: %w", kind, name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s", missing, name)
	}
	return nil
}

// UpdateBreaker changes breaker name's configuration with change, starting
// from the configuration it has (DefaultBreaker when it has none), in a
// compare-and-swap; every worker follows the change within a second. It
// returns the configuration written; an invalid one writes nothing.
func UpdateBreaker(ctx context.Context, cli *clientv3.Client, ns, name string, change func(*BreakerConfig) error) (BreakerConfig, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return BreakerConfig{}, err
	}
	if err := keyspace.CheckName("breaker name", name); err != nil {
		return BreakerConfig{}, err
	}
	var cfg BreakerConfig
	var refused error // change's own error, or the check's, returned as it is
	err = kv.Update(ctx, cli, keys.BreakerConfig(name), func(old []byte) ([]byte, error) {
		cfg = DefaultBreaker
		if old != nil {
			if err := json.Unmarshal(old, &cfg); err != nil {
				refused = fmt.Errorf("flow: breaker %s has an unreadable configuration: %w", name, err)
				return nil, refused
			}
		}
		if refused = change(&cfg); refused != nil {
			return nil, refused
		}
		if refused = cfg.Check("breaker"); refused != nil {
			return nil, refused
		}
		return json.Marshal(cfg)
	})
	if err != nil && err != refused {
		return BreakerConfig{}, fmt.Errorf("flow: set breaker %s: %w", name, err)
	}
	return cfg, err
}
