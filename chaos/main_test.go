package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// long reports whether the long versions run (DROVER_CHAOS=long).
func long() bool { return os.Getenv("DROVER_CHAOS") == "long" }

// TestMain runs the tests, removes what build built, and checks for
// leaked goroutines.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// build builds, once per test binary, the programs the tests run: the
// chaos worker, the lock client and the workflow worker (chaos/internal), and the drover command
// unless $DROVER_BIN names one. They are built without the race detector,
// so that the processes the faults hit run at the speed they would.
func build(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "drover-chaos-bin-")
		if buildErr != nil {
			return
		}
		pkgs := []string{"github.com/droverhq/drover/chaos/internal/chaosworker", "github.com/droverhq/drover/chaos/internal/lockclient",
			"github.com/droverhq/drover/chaos/internal/wfworker"}
		if os.Getenv("DROVER_BIN") == "" {
			pkgs = append(pkgs, "github.com/droverhq/drover/cmd/drover")
		}
		cmd := exec.Command("go", append([]string{"build", "-o", buildDir + string(filepath.Separator)}, pkgs...)...)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

// droverBin returns the drover binary the tests run: $DROVER_BIN when set,
// else one built from ./cmd/drover.
func droverBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("DROVER_BIN"); p != "" {
		return p
	}
	build(t)
	return filepath.Join(buildDir, "drover")
}

// workerBin returns the chaos worker binary (chaos/internal/chaosworker).
func workerBin(t *testing.T) string {
	t.Helper()
	build(t)
	return filepath.Join(buildDir, "chaosworker")
}

// lockClientBin returns the lock client binary (chaos/internal/lockclient).
func lockClientBin(t *testing.T) string {
	t.Helper()
	build(t)
	return filepath.Join(buildDir, "lockclient")
}
