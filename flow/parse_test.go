package flow_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/flow"
)

// TestParseLimitEdges: a limit spec's name, rate, burst and types, and the
// ways it is refused (each an input error naming the flag).
func TestParseLimitEdges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want flow.LimitSpec // zero: refused
	}{
		{"llm=500/m", flow.LimitSpec{Name: "llm", Rate: flow.Rate{Events: 500, Per: time.Minute, Burst: 9}}},
		{"llm=20/s;burst=40;types=chat,embed", flow.LimitSpec{Name: "llm", Rate: flow.Rate{Events: 20, Per: time.Second, Burst: 40}, Types: []string{"chat", "embed"}}},
		{"llm=20/s;types=chat;types=embed", flow.LimitSpec{Name: "llm", Rate: flow.Rate{Events: 20, Per: time.Second, Burst: 20}, Types: []string{"chat", "embed"}}},
		{"db=1/24h", flow.LimitSpec{Name: "db", Rate: flow.Rate{Events: 1, Per: 24 * time.Hour, Burst: 1}}},
		{"llm", flow.LimitSpec{}},
		{"=5/s", flow.LimitSpec{}},
		{"a b=5/s", flow.LimitSpec{}},
		{"llm=5", flow.LimitSpec{}},
		{"llm=5/s;burst=0", flow.LimitSpec{}},
		{"llm=5/s;burst=1e3", flow.LimitSpec{}},
		{"llm=5/s;burst=1000000001", flow.LimitSpec{}},
		{"llm=5/s;types=", flow.LimitSpec{}},
		{"llm=5/s;types=a,,b", flow.LimitSpec{}},
		{"llm=5/s;bogus=1", flow.LimitSpec{}},
		{"llm=5/s;", flow.LimitSpec{}},
	} {
		got, err := flow.ParseLimit("--limit", tc.in)
		if tc.want.Name == "" {
			if !errors.Is(err, drover.ErrInvalidInput) || !strings.Contains(err.Error(), "--limit") {
				t.Errorf("%q: %+v, %v; want an input error naming --limit", tc.in, got, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// TestParseQuotasEdges: quota specs of one name merge (every subject's
// limit, subjects' own limits, types); bad ones are refused whole.
func TestParseQuotasEdges(t *testing.T) {
	t.Parallel()
	got, err := flow.ParseQuotas("--quota", []string{"tenant=2", "warehouse=10;types=report", "tenant:acme=4;types=chat", "tenant:globex=1"})
	want := []flow.QuotaSpec{
		{Name: "tenant", Config: flow.QuotaConfig{Limit: 2, Subjects: map[string]int{"acme": 4, "globex": 1}}, Types: []string{"chat"}},
		{Name: "warehouse", Config: flow.QuotaConfig{Limit: 10}, Types: []string{"report"}},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("merged: %+v, %v; want %+v", got, err, want)
	}
	if got, err := flow.ParseQuotas("--quota", nil); err != nil || len(got) != 0 {
		t.Fatalf("none: %+v, %v", got, err)
	}
	if got, err := flow.ParseQuotas("--quota", []string{"tenant:acme=3"}); err != nil || got[0].Config.Limit != 0 || got[0].Config.Subjects["acme"] != 3 {
		t.Fatalf("one subject only: %+v, %v", got, err)
	}
	for _, bad := range [][]string{
		{"tenant"}, {"tenant=0"}, {"tenant=100001"}, {"tenant=x"}, {"tenant:a/b=1"}, {"bad name=1"},
		{"tenant=1;bogus=1"}, {"tenant=1;types="}, {"tenant=2", "tenant:acme=0"},
	} {
		if got, err := flow.ParseQuotas("--quota", bad); !errors.Is(err, drover.ErrInvalidInput) || !strings.Contains(err.Error(), "--quota") {
			t.Errorf("%q: %+v, %v; want an input error naming --quota", bad, got, err)
		}
	}
}

// TestParseBreakerEdges: a breaker spec changes its base field by field; a
// ratio brings a window and a minimum of calls unless given; the result is
// checked as a whole.
func TestParseBreakerEdges(t *testing.T) {
	t.Parallel()
	base := flow.BreakerConfig{Failures: 9, Cooldown: time.Minute}
	for _, tc := range []struct {
		in   string
		want flow.BreakerConfig
	}{
		{"crm", base},
		{"crm;failures=3;cooldown=10s", flow.BreakerConfig{Failures: 3, Cooldown: 10 * time.Second}},
		{"crm;ratio=0.5", flow.BreakerConfig{Failures: 9, Cooldown: time.Minute, Ratio: 0.5, Window: time.Minute, MinCalls: 20}},
		{"crm;window=30s;min-calls=5;ratio=0.25", flow.BreakerConfig{Failures: 9, Cooldown: time.Minute, Ratio: 0.25, Window: 30 * time.Second, MinCalls: 5}},
		{"crm;ratio=0.5;window=2m", flow.BreakerConfig{Failures: 9, Cooldown: time.Minute, Ratio: 0.5, Window: 2 * time.Minute, MinCalls: 20}},
	} {
		got, err := flow.ParseBreaker("--breaker", tc.in, base)
		if err != nil || got.Name != "crm" || got.Config != tc.want {
			t.Errorf("%q: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{
		"", "bad name", "crm;failures=0", "crm;failures=x", "crm;cooldown=50ms", "crm;cooldown=25h", "crm;cooldown=soon",
		"crm;ratio=1.5", "crm;ratio=NaN", "crm;ratio=0.5;window=500ms", "crm;ratio=0.5;min-calls=0", "crm;types=", "crm;bogus",
	} {
		if got, err := flow.ParseBreaker("--breaker", bad, base); !errors.Is(err, drover.ErrInvalidInput) || !strings.Contains(err.Error(), "--breaker") {
			t.Errorf("%q: %+v, %v; want an input error naming --breaker", bad, got, err)
		}
	}
	if spec, err := flow.ParseSpec(nil, nil, nil); err != nil || len(spec.Limits)+len(spec.Quotas)+len(spec.Breakers) != 0 {
		t.Fatalf("an empty spec: %+v, %v", spec, err)
	}
	if spec, _ := flow.ParseSpec(nil, nil, []string{"crm"}); spec.Breakers[0].Config != flow.DefaultBreaker {
		t.Fatalf("a breaker without settings: %+v, want the default", spec.Breakers[0])
	}
}

// TestOutcomesAndDeferrals: how a done's error is read by default, and
// what a deferral says.
func TestOutcomesAndDeferrals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want flow.Outcome
	}{
		{nil, flow.Succeeded},
		{errors.New("503"), flow.Failed},
		{context.DeadlineExceeded, flow.Failed},
		{context.Canceled, flow.Inconclusive},
		{fmt.Errorf("call: %w", context.Canceled), flow.Inconclusive},
	} {
		if got := flow.DefaultOutcome(tc.err); got != tc.want {
			t.Errorf("%v reads as %s, want %s", tc.err, got, tc.want)
		}
	}
	names := map[flow.Outcome]string{flow.Succeeded: "succeeded", flow.Failed: "failed", flow.Inconclusive: "inconclusive", flow.NotRun: "not run", 9: "Outcome(9)"}
	for o, want := range names {
		if o.String() != want {
			t.Errorf("%d names itself %q, want %q", int(o), o.String(), want)
		}
	}
	err := fmt.Errorf("gate: %w", &flow.DeferError{Reason: "quota tenant full", After: 1500 * time.Millisecond})
	var de *flow.DeferError
	if !errors.Is(err, flow.ErrDeferred) || !errors.As(err, &de) || de.After != 1500*time.Millisecond ||
		err.Error() != "gate: deferred for 1.5s: quota tenant full" {
		t.Fatalf("deferral %v", err)
	}
	if errors.Is(errors.New("deferred"), flow.ErrDeferred) {
		t.Fatal("any error is a deferral")
	}
}
