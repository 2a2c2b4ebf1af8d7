package cli

import (
	"errors"
	"fmt"
	"testing"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/cmd/drover/internal/demo"
)

// codeOf is the exit code Main gives err: its own, or the one exitCode
// finds.
func codeOf(err error) (code int, own bool) {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code, true
	}
	return exitCode(err), false
}

// TestDemoExitMapsBrokenInvariant: a demo's broken invariant, wrapped or
// not, carries exit code 1 (ExitFailure) of its own; other errors keep
// theirs (an unreachable etcd exits 69).
func TestDemoExitMapsBrokenInvariant(t *testing.T) {
	broken := fmt.Errorf("%w: a search ran twice", demo.ErrInvariant)
	for _, err := range []error{broken, fmt.Errorf("demo: %w", broken)} {
		if code, own := codeOf(demoExit(err)); code != ExitFailure || !own {
			t.Fatalf("%v: exit %d (own code %t), want %d of its own", err, code, own, ExitFailure)
		}
	}
	other := fmt.Errorf("demo: %w", cluster.ErrUnreachable)
	if code, own := codeOf(demoExit(other)); code != ExitUnavailable || own {
		t.Fatalf("unreachable etcd: exit %d (own code %t), want %d", code, own, ExitUnavailable)
	}
	if demoExit(nil) != nil {
		t.Fatal("no error: want nil")
	}
}
