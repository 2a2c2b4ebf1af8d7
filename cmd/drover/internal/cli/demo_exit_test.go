package cli_test

import (
	"strings"
	"testing"
)

// TestLostUpdateDemoUnreachableDatabase: an unreachable PostgreSQL exits 69,
// as an unreachable etcd does; it used to exit 1.
func TestLostUpdateDemoUnreachableDatabase(t *testing.T) {
	r := drover(t, "demo", "lost-update", "--store", "postgres", "--database-url", "postgres://127.0.0.1:1/test", "--workers", "1", "--invocations", "1")
	if r.code != 69 || !strings.Contains(r.stderr, "cannot reach PostgreSQL at postgres://127.0.0.1:1/test") || !strings.Contains(r.stderr, "--database-url") {
		t.Fatalf("exit %d; stderr %q", r.code, r.stderr)
	}
}
