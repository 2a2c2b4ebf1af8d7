package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/droverhq/drover/httpapi"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestEtcdBetweenLeadersIs503: the errors etcd gives while it has no
// leader, changes leader or stops (code Unavailable) are 503 with a retry,
// as are requests whose client left: drover server's in-process client of
// its embedded etcd hands them to the API (a gRPC client retried reads
// through some of them), and none is the server's fault.
func TestEtcdBetweenLeadersIs503(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		rpctypes.ErrLeaderChanged, rpctypes.ErrStopped, rpctypes.ErrNoLeader, rpctypes.ErrTimeout,
		rpctypes.ErrGRPCLeaderChanged, rpctypes.ErrGRPCStopped, rpctypes.ErrGRPCCanceled,
		fmt.Errorf("queue: claim: %w", rpctypes.ErrLeaderChanged), context.Canceled, context.DeadlineExceeded,
	} {
		if got := httpapi.StatusOf(err); got != http.StatusServiceUnavailable {
			t.Errorf("%v: %d, want 503", err, got)
		}
	}
	if got := httpapi.StatusOf(errors.New("something else")); got != http.StatusInternalServerError {
		t.Errorf("an unknown error: %d, want 500", got)
	}
}
