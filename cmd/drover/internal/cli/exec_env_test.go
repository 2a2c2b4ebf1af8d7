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

// TestExecHandlerDropsOuterStepFiles: a worker started from a step's
// command (its environment names that step's files and signal) does not
// hand them on to the command of a task that is not a step.
func TestExecHandlerDropsOuterStepFiles(t *testing.T) {
	for _, name := range []string{"DROVER_SIGNAL_FILE", "DROVER_SIGNAL_NAME", "DROVER_CHILDREN_FILE", "DROVER_WAIT_FILE", "DROVER_SPAWN_FILE", "DROVER_SLEEP_FILE", "DROVER_STATE_FILE"} {
		t.Setenv(name, "/outer/"+name)
	}
	h, err := workerHandler(`exec:printf '%s|%s|%s|%s|%s|%s|%s' "$DROVER_SIGNAL_FILE" "$DROVER_SIGNAL_NAME" "$DROVER_CHILDREN_FILE" "$DROVER_WAIT_FILE" "$DROVER_SPAWN_FILE" "$DROVER_SLEEP_FILE" "$DROVER_STATE_FILE"`, 1024, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := h(context.Background(), &queue.Task{ID: "x", Type: "t"})
	if err != nil || string(out) != "||||||" {
		t.Fatalf("output %q, %v; want no outer step's file or signal", out, err)
	}
}
