package stream_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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

// TestExpireSweepsEveryDueStream: one sweep removes every stream due,
// past its page of 100.
func TestExpireSweepsEveryDueStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{Retention: time.Hour, MaxAge: 10 * time.Hour})
	ctx := context.Background()
	now := time.Now()
	stream.SetNow(e.w, func() time.Time { return now })
	const streams = 150
	for i := range streams {
		id := fmt.Sprintf("due-%d", i)
		if _, _, err := e.w.Append(ctx, stream.Claim{Task: id, Attempt: 1, Fence: openFence{1}}, []stream.Input{{Type: "log"}}); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(11 * time.Hour)
	if n, err := e.w.Expire(ctx); err != nil || n != streams {
		t.Fatalf("one sweep removed %d streams (%v), want %d", n, err, streams)
	}
}

// TestEmitOverTheWriteCapIsRefused: one Emit whose events together are
// over one write's bytes is refused whole, and nothing is stored.
func TestEmitOverTheWriteCapIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	actx, _ := stream.Begin(ctx, e.cli, e.keys, stream.Claim{Task: "big", Attempt: 1, Fence: openFence{1}}, false)
	at := stream.FromContext(actx)
	data, _ := json.Marshal(strings.Repeat("x", 60<<10))
	ins := make([]stream.Input, 14) // 14 events of 60 KiB: each under the event cap, together over the write's
	for i := range ins {
		ins[i] = stream.Input{Type: "log", Data: data}
	}
	if err := at.Emit(actx, ins...); !errors.Is(err, stream.ErrStreamFull) {
		t.Fatalf("emit of %d bytes: %v, want ErrStreamFull", len(ins)*len(data), err)
	}
	if err := at.Flush(actx); err != nil {
		t.Fatal(err)
	}
	if last, err := e.hub.LastSeq(ctx, "big"); err != nil || last != 0 {
		t.Fatalf("stream holds %d events (%v), want none", last, err)
	}
}
