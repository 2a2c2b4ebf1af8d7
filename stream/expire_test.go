package stream_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestExpireRemovesEndedStreamsAfterRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{Retention: time.Hour, MaxAge: 10 * time.Hour})
	ctx := context.Background()
	now := time.Now()
	stream.SetNow(e.w, func() time.Time { return now })
	ended := stream.Claim{Task: "ended", Attempt: 1, Fence: claimKey(t, e.cli, e.keys, "ended")}
	open := stream.Claim{Task: "open", Attempt: 1, Fence: claimKey(t, e.cli, e.keys, "open")}
	for _, c := range []stream.Claim{ended, open} {
		if _, _, err := e.w.Append(ctx, c, []stream.Input{{Type: "log"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.w.End(ctx, ended, stream.Done, "succeeded", nil); err != nil {
		t.Fatal(err)
	}
	count := func(id string) int {
		r, err := e.cli.Get(ctx, e.keys.StreamChunks(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return int(r.Count)
	}
	if n, err := e.w.Expire(ctx); err != nil || n != 0 {
		t.Fatalf("before any is due: %d removed, %v", n, err)
	}
	now = now.Add(2 * time.Hour) // past the ended stream's retention
	if n, err := e.w.Expire(ctx); err != nil || n != 1 || count("ended") != 0 || count("open") == 0 {
		t.Fatalf("past the retention: %d removed (%v); ended has %d chunks, open %d", n, err, count("ended"), count("open"))
	}
	now = now.Add(9 * time.Hour) // past the open stream's age
	if n, err := e.w.Expire(ctx); err != nil || n != 1 || count("open") != 0 {
		t.Fatalf("past the maximum age: %d removed (%v); open has %d chunks", n, err, count("open"))
	}
}
