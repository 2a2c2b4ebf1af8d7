package registry_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/registry"
)

// srv is the embedded etcd the tests share; each test uses its own namespace.
var srv *etcdtest.Server

const helperEnv = "DROVER_REGISTRY_TEST_HELPER"

func TestMain(m *testing.M) {
	os.Exit(etcdtest.Main(m, &srv, helperEnv, runHelper))
}

// runHelper is a registered process: it registers endpoint H_ID of
// component H_COMPONENT with a 2 s primary lease, prints READY, and holds
// the registration until it is killed or its runtime stops.
func runHelper(string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: strings.Split(os.Getenv("H_ENDPOINTS"), ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	rt, err := process.Start(ctx, cli, process.WithTTL(2*time.Second), process.WithNamespace(os.Getenv("H_NS")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer rt.Shutdown(context.Background())
	if _, err := registry.Register(ctx, rt, os.Getenv("H_COMPONENT"), registry.Endpoint{ID: os.Getenv("H_ID"), Address: "127.0.0.1:1"}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("READY")
	select {
	case <-ctx.Done():
	case <-rt.Done():
	}
	return 0
}

// startRegistered starts a helper process that registers component/id in ns
// and returns once it is registered.
func startRegistered(t *testing.T, ns, component, id string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=register", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","),
		"H_NS="+ns, "H_COMPONENT="+component, "H_ID="+id)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := sc.Scan() && sc.Text() == "READY"
		ready <- ok
		for sc.Scan() {
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("helper for %s/%s did not register", component, id)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("helper for %s/%s not ready within 30 s", component, id)
	}
	return cmd
}
