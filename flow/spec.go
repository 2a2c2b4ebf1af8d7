package flow

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Spec is the flow control a worker applies: its rate limits, concurrency
// quotas and circuit breakers, in the grammar of drover worker's --limit,
// --quota and --breaker.
type Spec struct {
	Limits   []LimitSpec
	Quotas   []QuotaSpec
	Breakers []BreakerSpec
}

// ParseSpec reads a worker's limit, quota and breaker specs (each as its
// flag would give it), naming the flag in errors.
func ParseSpec(limits, quotas, breakers []string) (Spec, error) {
	var s Spec
	for _, l := range limits {
		ls, err := ParseLimit("--limit", l)
		if err != nil {
			return Spec{}, err
		}
		s.Limits = append(s.Limits, ls)
	}
	qs, err := ParseQuotas("--quota", quotas)
	if err != nil {
		return Spec{}, err
	}
	s.Quotas = qs
	for _, b := range breakers {
		bs, err := ParseBreaker("--breaker", b, DefaultBreaker)
		if err != nil {
			return Spec{}, err
		}
		s.Breakers = append(s.Breakers, bs)
	}
	return s, nil
}

// Gates opens the spec's quotas, breakers and rate limits and returns their
// gates in the order a worker applies them: quotas and breakers first (a
// task they hold off goes back to the queue, uncharged), then rate limits (a
// task waits for its tokens, which it would otherwise take and waste). The
// quotas' slots are bound to the lease that lease returns (the worker's).
// Configurations are created in etcd where absent; where etcd has its own,
// it wins (logged). closeAll gives back held tokens and slots and stops
// following changes; it is safe to call more than once.
func (s Spec) Gates(ctx context.Context, cli *clientv3.Client, ns string, lease func() clientv3.LeaseID, opts ...LimiterOption) (gates []Gate, closeAll func(ctx context.Context), err error) {
	var closers []func(context.Context)
	closeAll = func(ctx context.Context) {
		// A bounded context of its own: a caller's ended context must not
		// keep slots and tokens from going back.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, c := range closers {
			c(cctx)
		}
		closers = nil
	}
	defer func() {
		if err != nil {
			closeAll(ctx)
		}
	}()
	for _, q := range s.Quotas {
		qu, err := NewQuota(ctx, cli, ns, q.Name, q.Config, lease, q.Types...)
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func(ctx context.Context) { _ = qu.Close(ctx) })
		gates = append(gates, QuotaGate(qu))
	}
	for _, b := range s.Breakers {
		cfg := b.Config
		br, err := NewBreaker(ctx, cli, ns, b.Name, &cfg, b.Types...)
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func(ctx context.Context) { _ = br.Close(ctx) })
		gates = append(gates, BreakerGate(br))
	}
	for _, l := range s.Limits {
		r := l.Rate
		li, err := NewLimiter(ctx, cli, ns, l.Name, &r, opts...)
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func(ctx context.Context) { _ = li.Close(ctx) })
		gates = append(gates, RateGate(li, l.Types...))
	}
	return gates, closeAll, nil
}

// LimitSpec is one rate limit a worker applies, as drover worker --limit names it: 'NAME=RATE[;burst=N][;types=a,b]'.
type LimitSpec struct {
	Name  string
	Rate  Rate
	Types []string
}

const limitFlagRule = "must be NAME=RATE[;burst=N][;types=T1,T2] with RATE like 500/m or 20/s"

// ParseLimit reads a rate limit spec; field names it in errors.
func ParseLimit(field, s string) (LimitSpec, error) {
	bad := func(rule string) error { return &drover.InputError{Field: field, Value: s, Rule: rule} }
	parts := strings.Split(s, ";")
	name, rate, ok := strings.Cut(parts[0], "=")
	if !ok {
		return LimitSpec{}, bad(limitFlagRule)
	}
	if err := keyspace.CheckName(field, name); err != nil {
		return LimitSpec{}, err
	}
	r, err := ParseRate(field, rate)
	if err != nil {
		return LimitSpec{}, err
	}
	lf := LimitSpec{Name: name, Rate: r}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "burst":
			b, err := strconv.ParseInt(v, 10, 64)
			if err != nil || CheckBurst("burst", b) != nil {
				return LimitSpec{}, bad("burst must be an integer between 1 and 1e9")
			}
			lf.Rate.Burst = b
		case "types":
			for _, t := range strings.Split(v, ",") {
				if err := keyspace.CheckName(field+" types", t); err != nil {
					return LimitSpec{}, err
				}
				lf.Types = append(lf.Types, t)
			}
		default:
			return LimitSpec{}, bad(limitFlagRule)
		}
	}
	return lf, nil
}

// QuotaSpec is one quota a worker applies, as drover worker --quota names it: 'NAME=K' sets the limit of
// every subject, 'NAME:SUBJECT=K' one subject's own limit.
type QuotaSpec struct {
	Name   string
	Config QuotaConfig
	Types  []string
}

const quotaFlagRule = "must be NAME[:SUBJECT]=K[;types=T1,T2]: NAME tenant (per tenant), type (per task type) or a resource name; SUBJECT one tenant or type with a limit of its own; K from 1 to 100000"

// ParseQuotas reads quota specs, merging those of one quota; field names
// them in errors.
func ParseQuotas(field string, flags []string) ([]QuotaSpec, error) {
	var out []QuotaSpec
	index := map[string]int{}
	for _, s := range flags {
		bad := &drover.InputError{Field: field, Value: s, Rule: quotaFlagRule}
		parts := strings.Split(s, ";")
		target, k, ok := strings.Cut(parts[0], "=")
		if !ok {
			return nil, bad
		}
		name, subject, _ := strings.Cut(target, ":")
		if keyspace.CheckName(field, name) != nil || (subject != "" && strings.Contains(subject, "/")) {
			return nil, bad
		}
		n, err := strconv.Atoi(k)
		if err != nil || CheckQuotaLimit(field, n) != nil {
			return nil, bad
		}
		i, seen := index[name]
		if !seen {
			i = len(out)
			index[name] = i
			out = append(out, QuotaSpec{Name: name})
		}
		qf := &out[i]
		if subject == "" {
			qf.Config.Limit = n
		} else {
			if qf.Config.Subjects == nil {
				qf.Config.Subjects = map[string]int{}
			}
			qf.Config.Subjects[subject] = n
		}
		for _, p := range parts[1:] {
			v, ok := strings.CutPrefix(p, "types=")
			if !ok {
				return nil, bad
			}
			for _, t := range strings.Split(v, ",") {
				if err := keyspace.CheckName(field+" types", t); err != nil {
					return nil, err
				}
				qf.Types = append(qf.Types, t)
			}
		}
	}
	return out, nil
}

// BreakerSpec is one circuit breaker a worker applies, as drover worker --breaker names it: 'NAME[;failures=N][;cooldown=D][;types=a,b]'.
type BreakerSpec struct {
	Name   string
	Config BreakerConfig
	Types  []string
}

const breakerFlagRule = "must be NAME[;failures=N][;cooldown=DURATION][;ratio=R][;window=DURATION][;min-calls=N][;types=T1,T2]"

// ParseBreaker reads a breaker spec 'NAME[;failures=N]...' over the
// configuration base (DefaultBreaker for a new one); field names it in
// errors.
func ParseBreaker(field, s string, base BreakerConfig) (BreakerSpec, error) {
	bad := func(rule string) error { return &drover.InputError{Field: field, Value: s, Rule: rule} }
	parts := strings.Split(s, ";")
	if err := keyspace.CheckName(field, parts[0]); err != nil {
		return BreakerSpec{}, err
	}
	bf := BreakerSpec{Name: parts[0], Config: base}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "failures":
			n, err := strconv.Atoi(v)
			if err != nil {
				return BreakerSpec{}, bad("failures must be an integer")
			}
			bf.Config.Failures = n
		case "cooldown":
			d, err := time.ParseDuration(v)
			if err != nil {
				return BreakerSpec{}, bad("cooldown must be a duration such as 30s")
			}
			bf.Config.Cooldown = d
		case "ratio":
			r, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return BreakerSpec{}, bad("ratio must be a number between 0 and 1")
			}
			bf.Config.Ratio = r
			if bf.Config.Window == 0 {
				bf.Config.Window = time.Minute
			}
			if bf.Config.MinCalls == 0 {
				bf.Config.MinCalls = 20
			}
		case "window":
			d, err := time.ParseDuration(v)
			if err != nil {
				return BreakerSpec{}, bad("window must be a duration such as 1m")
			}
			bf.Config.Window = d
		case "min-calls":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return BreakerSpec{}, bad("min-calls must be an integer")
			}
			bf.Config.MinCalls = n
		case "types":
			for _, t := range strings.Split(v, ",") {
				if err := keyspace.CheckName(field+" types", t); err != nil {
					return BreakerSpec{}, err
				}
				bf.Types = append(bf.Types, t)
			}
		default:
			return BreakerSpec{}, bad(breakerFlagRule)
		}
	}
	if err := bf.Config.Check(field); err != nil {
		return BreakerSpec{}, err
	}
	return bf, nil
}
