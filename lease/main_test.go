package lease_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/droverhq/drover/internal/etcdtest"
	"go.uber.org/goleak"
)

// srv is the embedded etcd every test and example of this package shares;
// each test uses its own namespace.
var srv *etcdtest.Server

func TestMain(m *testing.M) {
	srv = etcdtest.MustStart(etcdtest.Options{})
	code := m.Run()
	srv.Stop()
	if code == 0 {
		if err := goleak.Find(etcdtest.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
