package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/queue"
)

// TestExecHandlerEnvAndErrors: an exec handler's command gets the
// worker's connection (credentials too) in its environment, not in its
// command line, and its errors name the shell that ran it.
func TestExecHandlerEnvAndErrors(t *testing.T) {
	env := []string{"ETCD_ENDPOINTS=http://e:2379", "DROVER_NAMESPACE=ns", "ETCDCTL_PASSWORD=secret"}
	h, err := workerHandler(`exec:printf '%s %s %s' "$ETCD_ENDPOINTS" "$DROVER_NAMESPACE" "$ETCDCTL_PASSWORD"`, 1024, time.Second, env)
	if err != nil {
		t.Fatal(err)
	}
	out, err := h(context.Background(), &queue.Task{ID: "x", Type: "t"})
	if err != nil || string(out) != "http://e:2379 ns secret" {
		t.Fatalf("output %q, %v", out, err)
	}
	h, err = workerHandler("exec:exit 3", 1024, time.Second, env)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h(context.Background(), &queue.Task{ID: "x", Type: "t"})
	if err == nil || !strings.HasPrefix(err.Error(), "sh: ") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("error %v, want one that names sh and no credential", err)
	}
}
