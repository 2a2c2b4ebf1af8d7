package steal_test

import (
	"os"
	"testing"

	"github.com/droverhq/drover/internal/testenv/steal"
)

// TestTotalNeverFalls: the steal read twice never goes back, and is read
// at all where /proc/stat exists (a parse that failed would give zero
// silently: a machine with no steal at all gives zero too, so only the
// order is checked).
func TestTotalNeverFalls(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc/stat on this system")
	}
	a := steal.Total()
	b := steal.Total()
	if a < 0 || b < a {
		t.Fatalf("steal read %v then %v", a, b)
	}
}
