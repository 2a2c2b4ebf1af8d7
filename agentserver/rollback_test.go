package agentserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
)

// TestRollbackCrashKeepsTheHead: a rollback's deletion of a run's
// checkpoints (more than one transaction holds) whose server dies after
// any number of its writes never leaves the thread's head naming a
// deleted checkpoint, and done again it finishes.
func TestRollbackCrashKeepsTheHead(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	store, err := checkpoint.NewEtcd(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	sp := keyspace.MustNew(a.ns)
	th := "1f0a0000-0000-4000-8000-0000000000bb"
	add := func(run string, n int) {
		for range n {
			if _, err := store.Append(ctx, checkpoint.Checkpoint{ThreadID: th,
				Metadata: checkpoint.MetadataOf(map[string]json.RawMessage{"run_id": json.RawMessage(fmt.Sprintf("%q", run))}), State: []byte(`{}`)}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	add("kept", 2)
	add("stopped", 70)
	headOK := func(n int64) string {
		g, err := a.cli.Get(ctx, sp.CheckpointHead(th, keyspace.CheckpointNSName("")))
		if err != nil || len(g.Kvs) == 0 {
			t.Fatalf("after a crash at write %d: no head: %v", n, err)
		}
		head := string(g.Kvs[0].Value)
		if c, err := a.cli.Get(ctx, sp.CheckpointKey(th, keyspace.CheckpointNSName(""), head)); err != nil || len(c.Kvs) == 0 {
			t.Fatalf("after a crash at write %d: the head names checkpoint %s, which is deleted", n, head)
		}
		return head
	}
	for n := int64(0); n < 3; n++ {
		_ = agentserver.DeleteRunCheckpointsOn(ctx, crashClient(t, a.cli, n), a.ns, th, "stopped")
		headOK(n)
	}
	if err := agentserver.DeleteRunCheckpointsOn(ctx, a.cli, a.ns, th, "stopped"); err != nil {
		t.Fatal(err)
	}
	left, err := store.List(ctx, th, "", checkpoint.ListOptions{Filter: map[string]any{"run_id": "stopped"}})
	if err != nil || len(left) != 0 {
		t.Fatalf("the stopped run's checkpoints left: %d, %v", len(left), err)
	}
	headOK(99)
}
