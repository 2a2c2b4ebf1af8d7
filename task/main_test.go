package task_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/droverhq/drover/internal/etcdtest"
	"go.uber.org/goleak"
)

var srv *etcdtest.Server

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
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
