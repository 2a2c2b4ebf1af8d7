package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cmd/drover/internal/cli"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var droverEnds = cli.EndsStream

// openFence is a fence that always holds, for a test that writes a
// task's stream without a claim.
type openFence struct{}

func (openFence) Token() int64             { return 1 }
func (openFence) Compares() []clientv3.Cmp { return nil }
func (openFence) Err() error               { return nil }

// TestFollowOfAnAgentTaskCompletedLongAgo: drover tasks follow of an
// agent task that completed, with no done, longer ago than the wait for
// a late done ends at its first check: its completing checkpoint says
// when it ended, whatever that wait (an hour here).
func TestFollowOfAnAgentTaskCompletedLongAgo(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	keys := keyspace.MustNew(ns)
	ctx := context.Background()
	const id = "agent-long"
	cp, _ := json.Marshal(map[string]any{"step": 1, "steps": 1, "completed": true, "at": time.Now().Add(-2 * time.Hour).UTC()})
	if _, err := cli.Put(ctx, keys.TaskCheckpoint(id), string(cp)); err != nil {
		t.Fatal(err)
	}
	w := stream.NewWriter(cli, keys, stream.Limits{}, time.Millisecond)
	if _, _, err := w.Append(ctx, stream.Claim{Task: id, Attempt: 1, Fence: openFence{}}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var types []string
	for ev, err := range stream.NewHub(cli, keys).Follow(fctx, id, 1, droverEnds(qc, cli, ns, id), stream.SettleAfter(time.Hour)) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
	}
	if fctx.Err() != nil || strings.Join(types, " ") != "attempt_started log" {
		t.Fatalf("follower got %v (timed out: %v), want attempt_started log, then its end at once", types, fctx.Err() != nil)
	}
}
