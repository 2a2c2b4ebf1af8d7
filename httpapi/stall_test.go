package httpapi_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStallNeedsTwoUnansweredProbes: the long requests under way end only
// after two probes in a row that etcd did not answer (a deadline, etcd
// unavailable); an answer, even an error such as permission denied or a
// leader change, starts the count again.
func TestStallNeedsTwoUnansweredProbes(t *testing.T) {
	t.Parallel()
	late := fmt.Errorf("probe: %w", context.DeadlineExceeded)
	down := status.Error(codes.Unavailable, "etcdserver: no leader")
	for _, c := range []struct {
		name string
		errs []error
		want []bool
	}{
		{"one late probe", []error{late}, []bool{false}},
		{"two late probes", []error{late, late, late}, []bool{false, true, true}},
		{"late, answered, late", []error{late, nil, late}, []bool{false, false, false}},
		{"unavailable twice", []error{down, down}, []bool{false, true}},
		{"a deadline code twice", []error{status.Error(codes.DeadlineExceeded, "x"), rpctypes.ErrTimeout}, []bool{false, true}},
		{"permission denied", []error{rpctypes.ErrPermissionDenied, rpctypes.ErrPermissionDenied, rpctypes.ErrPermissionDenied}, []bool{false, false, false}},
		{"leader changes", []error{rpctypes.ErrLeaderChanged, rpctypes.ErrLeaderChanged, rpctypes.ErrGRPCLeaderChanged}, []bool{false, false, false}},
		{"late, leader change, late", []error{late, rpctypes.ErrLeaderChanged, late}, []bool{false, false, false}},
	} {
		if got := httpapi.StallDecisions(c.errs...); !slices.Equal(got, c.want) {
			t.Errorf("%s: stalled %v, want %v", c.name, got, c.want)
		}
	}
}

// TestUnavailableRetryAfterVaries: a 503 for an etcd that did not answer
// says Retry-After 1 or 2, both, so that the requests a stall ends do not
// all come back in the same second.
func TestUnavailableRetryAfterVaries(t *testing.T) {
	t.Parallel()
	seen := map[string]int{}
	for range 200 {
		seen[httpapi.RetryAfterOf(context.DeadlineExceeded)]++
	}
	if len(seen) != 2 || seen["1"] == 0 || seen["2"] == 0 {
		t.Fatalf("Retry-After values: %v, want 1 and 2", seen)
	}
}

// TestRequestTimeoutMinimum: a request timeout under 100ms is refused,
// naming the field and the rule.
func TestRequestTimeoutMinimum(t *testing.T) {
	t.Parallel()
	cfg := httpapi.Config{Etcd: srv.LocalClient(t), RequestTimeout: 50 * time.Millisecond}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "RequestTimeout") || !strings.Contains(err.Error(), "100ms") {
		t.Fatalf("RequestTimeout 50ms: %v", err)
	}
	cfg.RequestTimeout = httpapi.MinRequestTimeout
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}
