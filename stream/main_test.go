package stream_test

import (
	"os"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// srv is the embedded etcd every test of this package shares; each test
// uses its own namespace.
var srv *etcdtest.Server

func TestMain(m *testing.M) {
	os.Exit(etcdtest.Main(m, &srv, "", nil))
}
