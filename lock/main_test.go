package lock_test

import (
	"os"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock/internal/proctest"
)

// srv is the embedded etcd every test of this package shares; each test uses
// its own namespace.
var srv *etcdtest.Server

func TestMain(m *testing.M) {
	code := etcdtest.Main(m, &srv, proctest.Env, runHelper)
	if benchSrv != nil {
		benchSrv.Stop()
	}
	os.Exit(code)
}
