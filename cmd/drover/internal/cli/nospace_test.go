package cli_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cmd/drover/internal/cli"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestNoSpaceExitsBusy: etcd's NOSPACE refusal, typed and wrapped or only
// as the text of a gRPC error, exits 75 like a full store.
func TestNoSpaceExitsBusy(t *testing.T) {
	for _, err := range []error{rpctypes.ErrNoSpace, fmt.Errorf("lock: new session: %w", rpctypes.ErrNoSpace),
		errors.New("rpc error: code = ResourceExhausted desc = etcdserver: mvcc: database space exceeded")} {
		if got := cli.ExitCode(err); got != cli.ExitBusy {
			t.Fatalf("exit code of %v: %d, want %d", err, got, cli.ExitBusy)
		}
	}
}

// TestLockRunExitsBusyOnNOSPACE: with etcd's NOSPACE alarm raised, `drover
// lock run` cannot have a lease: it exits 75 without running its command,
// and says what to do. It used to exit 1.
func TestLockRunExitsBusyOnNOSPACE(t *testing.T) {
	srv, c := etcdtest.QuotaServer(t, 16<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	big := strings.Repeat("x", 1<<20)
	var err error
	for i := 0; i < 40 && err == nil; i++ {
		_, err = c.Put(ctx, fmt.Sprintf("/filler/%03d", i), big)
	}
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("filling a 16 MiB store: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	r := drover(t, "--etcd-endpoints", srv.Endpoints()[0], "--namespace", etcdtest.Namespace(t), "lock", "run", "nightly", "--", "echo", "ran")
	if r.code != cli.ExitBusy || strings.Contains(r.stdout, "ran") || !strings.Contains(r.stderr, "NOSPACE") || !strings.Contains(r.stderr, "drover tasks purge") {
		t.Fatalf("drover lock run under NOSPACE: exit %d, stdout %q, stderr %q; want %d with advice", r.code, r.stdout, r.stderr, cli.ExitBusy)
	}
}
