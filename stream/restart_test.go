package stream_test

import (
	"context"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/stream"
)

// TestStreamSurvivesARestart: events stored before etcd stops are all
// there after it starts again on the same data, and the attempt goes on
// after them.
func TestStreamSurvivesARestart(t *testing.T) {
	t.Parallel()
	dir, addr := t.TempDir(), "http://"+etcdtest.FreeAddr()
	first, err := etcdtest.Start(etcdtest.Options{Dir: dir, ClientURL: addr})
	if err != nil {
		t.Fatal(err)
	}
	keys := keyspace.MustNew("restart")
	cli := first.Client(t)
	ctx := context.Background()
	c := claimKey(t, cli, keys, "r-1")
	w := stream.NewWriter(cli, keys, stream.Limits{}, 0)
	a := stream.Claim{Task: "r-1", Attempt: 1, Fence: c}
	for i := range 10 {
		if _, _, err := w.Append(ctx, a, []stream.Input{{Type: "log", Data: text(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	first.Stop()

	second, err := etcdtest.Start(etcdtest.Options{Dir: dir, ClientURL: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Stop()
	cli2 := second.Client(t)
	w2 := stream.NewWriter(cli2, keys, stream.Limits{}, 0) // a new process: it reads the stream's end
	if first, _, err := w2.Append(ctx, a, []stream.Input{{Type: "log", Data: text(10)}}); err != nil || first != 12 {
		t.Fatalf("append after the restart: seq %d, %v; want 12", first, err)
	}
	if err := w2.End(ctx, a, stream.Done, "succeeded", nil); err != nil {
		t.Fatal(err)
	}
	got := collect(t, stream.NewHub(cli2, keys), "r-1", 1, 0)
	if len(got) != 13 || got[0].Type != stream.AttemptStarted || got[12].Type != stream.Done {
		t.Fatalf("%d events after the restart: %+v", len(got), got)
	}
	checkSeq(t, got, 1)
	for i, ev := range got[1:12] {
		if string(ev.Data) != string(text(i)) {
			t.Fatalf("event %d: %s", i+2, ev.Data)
		}
	}
}

// TestEmitGoesOnAfterEtcdWasAway: a write that failed because etcd was
// away is reported once; the attempt's later emits are stored, after
// the events stored before.
func TestEmitGoesOnAfterEtcdWasAway(t *testing.T) {
	t.Parallel()
	dir, addr := t.TempDir(), "http://"+etcdtest.FreeAddr()
	first, err := etcdtest.Start(etcdtest.Options{Dir: dir, ClientURL: addr})
	if err != nil {
		t.Fatal(err)
	}
	keys := keyspace.MustNew("away")
	cli := first.Client(t)
	ctx := context.Background()
	c := claimKey(t, cli, keys, "aw-1")
	actx, at := stream.Begin(ctx, cli, keys, stream.Claim{Task: "aw-1", Attempt: 1, Fence: c}, false)
	if err := stream.Emit(actx, "log", 1); err != nil {
		t.Fatal(err)
	}
	if err := stream.Flush(actx); err != nil {
		t.Fatal(err)
	}
	first.Stop()
	if err := stream.Emit(actx, "log", 2); err != nil {
		t.Fatal(err)
	}
	if err := stream.Flush(actx); err == nil {
		t.Fatal("a write while etcd is away succeeded")
	}
	second, err := etcdtest.Start(etcdtest.Options{Dir: dir, ClientURL: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Stop()
	if err := stream.Emit(actx, "log", 3); err != nil {
		t.Fatalf("emit after etcd is back: %v", err)
	}
	if err := stream.Flush(actx); err != nil {
		t.Fatalf("flush after etcd is back: %v", err)
	}
	if err := at.End(ctx, stream.Done, "succeeded", nil); err != nil {
		t.Fatal(err)
	}
	var data []string
	for _, ev := range collect(t, stream.NewHub(second.Client(t), keys), "aw-1", 1, 0) {
		if ev.Type == "log" {
			data = append(data, string(ev.Data))
		}
	}
	if len(data) < 2 || data[0] != "1" || data[len(data)-1] != "3" {
		t.Fatalf("log events %v, want 1, (2,) 3", data)
	}
}
