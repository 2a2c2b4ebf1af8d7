package history_test

import (
	"os"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

var srv *etcdtest.Server

func TestMain(m *testing.M) {
	os.Exit(etcdtest.Main(m, &srv, "", nil))
}
