package paxoslock_test

import (
	"os"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock/internal/proctest"
)

// TestMain runs a helper process when the test binary is started as one
// (see lock/internal/proctest), and checks for leaked goroutines.
func TestMain(m *testing.M) {
	os.Exit(etcdtest.Main(m, nil, proctest.Env, runHelper))
}
