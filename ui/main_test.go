package ui_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"go.uber.org/goleak"
)

// etcd is the embedded etcd the package's tests share; each test serves
// the API in a namespace of its own.
var etcd *etcdtest.Server

func TestMain(m *testing.M) {
	if _, err := os.Stat(chromium); err == nil {
		go browser.once.Do(startBrowser) // while etcd starts; tests wait for it
	}
	etcd = etcdtest.MustStart(etcdtest.Options{})
	code := m.Run()
	closeBrowser()
	etcd.Stop()
	if code == 0 {
		if err := goleak.Find(etcdtest.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
