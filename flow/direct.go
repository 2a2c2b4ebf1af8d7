package flow

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// This file is flow control for callers that are not queue workers and hold
// no Limiter of their own (the HTTP API, on behalf of agents in other
// languages): each call is one compare-and-swap on the shared bucket, with
// nothing held locally between calls.

// TakeResult is what TakeTokens did.
type TakeResult struct {
	// Granted says whether the tokens were taken.
	Granted bool
	// RetryIn, when not granted, is how long until the bucket holds the
	// tokens asked for at the current rate (others may take them first).
	RetryIn time.Duration
	// Usage is the limit with its bucket after the call.
	Usage LimitUsage
}

// GetLimit reads rate limit name with its bucket as it stands now;
// ErrNoLimit when it has no configuration.
func GetLimit(ctx context.Context, cli *clientv3.Client, ns, name string) (LimitUsage, error) {
	return changeBucket(ctx, cli, ns, name, time.Now, func(*bucketState, Rate) (bool, error) { return false, nil })
}

// TakeTokens takes n tokens from rate limit name's shared bucket if it holds
// them now, in one compare-and-swap (repeated on a conflicting write); when
// it does not, it takes nothing and says how long until it would. n must be
// at least 1 and at most the limit's burst (ErrExceedsBurst). ErrNoLimit
// when the limit has no configuration.
func TakeTokens(ctx context.Context, cli *clientv3.Client, ns, name string, n int64) (TakeResult, error) {
	return takeTokens(ctx, cli, ns, name, n, time.Now)
}

// takeTokens is TakeTokens with the bucket refilled by the clock now.
func takeTokens(ctx context.Context, cli *clientv3.Client, ns, name string, n int64, now func() time.Time) (TakeResult, error) {
	if n < 1 {
		return TakeResult{}, &drover.InputError{Field: "n", Value: n, Rule: "must be at least 1"}
	}
	var res TakeResult
	u, err := changeBucket(ctx, cli, ns, name, now, func(st *bucketState, r Rate) (bool, error) {
		res = TakeResult{}
		if n > r.Burst {
			return false, fmt.Errorf("%w: %d tokens of %s, burst %d", ErrExceedsBurst, n, name, r.Burst)
		}
		if st.Tokens < float64(n) {
			missing := float64(n) - st.Tokens
			res.RetryIn = time.Duration(math.Ceil(missing/r.PerSecond()*1e9)) + time.Millisecond
			return false, nil
		}
		st.Tokens -= float64(n)
		st.Used += n
		res.Granted = true
		return true, nil
	})
	if err != nil {
		return TakeResult{}, err
	}
	res.Usage = u
	if res.Granted {
		metrics.RateLimitTokensUsed.WithLabelValues(name).Add(float64(n))
	}
	return res, nil
}

// GiveTokens gives n tokens back to rate limit name's bucket (a call that
// used fewer than it took), or takes -n more as a debt that later takes pay
// (one that used more). The bucket's recorded usage changes by -n; it never
// holds more than its burst. It returns the limit after the change.
func GiveTokens(ctx context.Context, cli *clientv3.Client, ns, name string, n int64) (LimitUsage, error) {
	return changeBucket(ctx, cli, ns, name, time.Now, func(st *bucketState, r Rate) (bool, error) {
		if n == 0 {
			return false, nil
		}
		st.Tokens = math.Min(float64(r.Burst), st.Tokens+float64(n))
		st.Used -= n
		return true, nil
	})
}

// changeBucket reads limit name's configuration and bucket (refilled to
// now()) and passes them to change, which edits the bucket and says whether
// to write it; the write is a compare-and-swap on the bucket's revision,
// and a conflicting write starts over. It returns the limit as it stands
// after the change.
func changeBucket(ctx context.Context, cli *clientv3.Client, ns, name string, now func() time.Time, change func(st *bucketState, r Rate) (bool, error)) (LimitUsage, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return LimitUsage{}, err
	}
	if err := keyspace.CheckName("limit name", name); err != nil {
		return LimitUsage{}, err
	}
	cfgKey, stKey := keys.LimitConfig(name), keys.LimitState(name)
	for {
		resp, err := cli.Txn(ctx).Then(clientv3.OpGet(cfgKey), clientv3.OpGet(stKey)).Commit()
		if err != nil {
			return LimitUsage{}, fmt.Errorf("flow: read limit %s: %w", name, err)
		}
		cfg, stKVs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		if len(cfg) == 0 {
			return LimitUsage{}, fmt.Errorf("%w: %s (set it with `drover limits set %s RATE`)", ErrNoLimit, name, name)
		}
		var r Rate
		if err := json.Unmarshal(cfg[0].Value, &r); err != nil {
			return LimitUsage{}, fmt.Errorf("flow: limit %s has an unreadable configuration: %w", name, err)
		}
		var st bucketState
		var mr int64
		if len(stKVs) == 1 {
			_ = json.Unmarshal(stKVs[0].Value, &st)
			mr = stKVs[0].ModRevision
		}
		st = st.refill(r, now())
		write, err := change(&st, r)
		u := LimitUsage{Name: name, Rate: r.String(), PerSecond: r.PerSecond(), Burst: r.Burst, Available: st.Tokens, Used: st.Used}
		if err != nil || !write {
			return u, err
		}
		b, _ := json.Marshal(st)
		began := time.Now()
		tr, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(stKey), "=", mr)).Then(clientv3.OpPut(stKey, string(b))).Commit()
		metrics.ObserveTxn("ratelimit", began)
		if err != nil {
			return LimitUsage{}, fmt.Errorf("flow: update limit %s: %w", name, err)
		}
		if tr.Succeeded {
			return u, nil
		}
	}
}
