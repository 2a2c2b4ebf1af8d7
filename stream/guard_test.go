package stream_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// chunkKeys counts the keys of task id's stream.
func chunkKeys(t *testing.T, e env, id string) int64 {
	t.Helper()
	r, err := e.cli.Get(context.Background(), e.keys.StreamChunks(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

// TestFullStoreRefusesEventsButNotEnds: while the store-full guard key
// is set, a write of events (Append, Emit) is refused with a
// *drover.StoreFullError and adds no key; the attempt's end and the
// task's Done still go (so followers see the stream end); once the key
// is gone, events are accepted again.
func TestFullStoreRefusesEventsButNotEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id, fresh = "full", "fresh"
	a := stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}
	if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	full := &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.8, LowWater: 0.7, Since: time.Now()}
	if err := storeguard.Set(ctx, e.cli, full, e.keys); err != nil {
		t.Fatal(err)
	}
	keys := chunkKeys(t, e, id)
	var sf *drover.StoreFullError
	if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "log"}}); !errors.As(err, &sf) || sf.Quota != 10 {
		t.Fatalf("append to a full store: %v, want a *drover.StoreFullError", err)
	}
	b := stream.Claim{Task: fresh, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, fresh)}
	if _, _, err := e.w.Append(ctx, b, []stream.Input{{Type: "log"}}); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("a new stream in a full store: %v, want ErrStoreFull", err)
	}
	_, at := stream.Begin(ctx, e.cli, e.keys, a, true)
	if err := at.Emit(ctx, stream.Input{Type: "emitted"}); err != nil {
		t.Fatal(err)
	}
	if err := at.Flush(ctx); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("flush of an emit to a full store: %v, want ErrStoreFull", err)
	}
	if got := chunkKeys(t, e, id); got != keys {
		t.Fatalf("the full store took %d keys of the stream, want %d", got, keys)
	}
	if got := chunkKeys(t, e, fresh); got != 0 {
		t.Fatalf("the full store took %d keys of a new stream, want none", got)
	}
	// The end goes: one attempt_ended, then the task's done.
	if err := e.w.End(ctx, a, stream.AttemptEnded, "failed", nil); err != nil {
		t.Fatalf("end in a full store: %v", err)
	}
	if err := e.w.Finish(ctx, id, "dead", ""); err != nil {
		t.Fatalf("finish in a full store: %v", err)
	}
	got := collect(t, e.hub, id, 1, 10)
	want := []string{stream.AttemptStarted, "log", stream.AttemptEnded, stream.Done}
	if len(got) != len(want) {
		t.Fatalf("followed %d events, want %v", len(got), want)
	}
	for i := range want {
		if got[i].Type != want[i] {
			t.Fatalf("event %d is %s, want %s", i+1, got[i].Type, want[i])
		}
	}
	if err := storeguard.Clear(ctx, e.cli, e.keys); err != nil {
		t.Fatal(err)
	}
	if first, _, err := e.w.Append(ctx, b, []stream.Input{{Type: "log"}}); err != nil || first != 2 {
		t.Fatalf("append once the store has room: first %d, %v; want 2 (after attempt_started)", first, err)
	}
}

// TestFullStoreEndsAfterRefusedEmits: an attempt whose emits a full
// store refused still ends: its end goes alone, right after the
// stream's stored events.
func TestFullStoreEndsAfterRefusedEmits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id = "mixed"
	a := stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}
	if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	if err := storeguard.Set(ctx, e.cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.8, LowWater: 0.7}, e.keys); err != nil {
		t.Fatal(err)
	}
	_, at := stream.Begin(ctx, e.cli, e.keys, a, true)
	for range 20 {
		if err := at.Emit(ctx, stream.Input{Type: "lost"}); err != nil && !errors.Is(err, drover.ErrStoreFull) {
			t.Fatal(err)
		}
	}
	if err := at.End(ctx, stream.AttemptEnded, "failed", nil); err != nil {
		t.Fatalf("end after refused emits: %v", err)
	}
	got := collect(t, e.hub, id, 1, 3)
	if len(got) != 3 || got[1].Type != "log" || got[2].Type != stream.AttemptEnded || got[2].Seq != 3 {
		t.Fatalf("followed %+v, want attempt_started, log, attempt_ended (seq 3)", got)
	}
}

// setFull sets the store-full guard key of e's namespace.
func setFull(t *testing.T, e env) {
	t.Helper()
	full := &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.8, LowWater: 0.7}
	if err := storeguard.Set(context.Background(), e.cli, full, e.keys); err != nil {
		t.Fatal(err)
	}
}

// types returns the types of the events of task id's stream.
func types(t *testing.T, e env, id string) []string {
	t.Helper()
	var out []string
	err := e.hub.Read(context.Background(), id, 1, func(list []stream.Event) bool {
		for _, ev := range list {
			out = append(out, ev.Type)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFullStoreEndsInTheSameBatchAsEvents: in one batch, one stream's
// events and its end, and another stream's end alone: the full store
// refuses the events, and both ends are written, each right after its
// stream's stored events.
func TestFullStoreEndsInTheSameBatchAsEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	x := stream.Claim{Task: "x", Attempt: 1, Fence: claimKey(t, e.cli, e.keys, "x")}
	y := stream.Claim{Task: "y", Attempt: 1, Fence: claimKey(t, e.cli, e.keys, "y")}
	for _, c := range []stream.Claim{x, y} {
		if _, _, err := e.w.Append(ctx, c, []stream.Input{{Type: "log"}}); err != nil {
			t.Fatal(err)
		}
	}
	setFull(t, e)
	errs := stream.FlushBatch(ctx, e.w, []stream.Write{
		{C: x, Events: []stream.Input{{Type: "lost"}}},
		{C: x, End: stream.AttemptEnded},
		{C: y, End: stream.AttemptEnded},
	})
	if !errors.Is(errs[0], drover.ErrStoreFull) || errs[1] != nil || errs[2] != nil {
		t.Fatalf("errors %v, want ErrStoreFull for the events and none for the ends", errs)
	}
	want := []string{stream.AttemptStarted, "log", stream.AttemptEnded}
	for _, id := range []string{"x", "y"} {
		if got := types(t, e, id); !slices.Equal(got, want) {
			t.Fatalf("stream %s is %v, want %v", id, got, want)
		}
	}
}

// TestFullStoreEndIsNoConflict: an end refused with other streams'
// events round after round (three attempts of one task in one batch go
// in three rounds) is no conflict of its claim: it is written once the
// events are answered.
func TestFullStoreEndIsNoConflict(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	y := stream.Claim{Task: "y", Attempt: 1, Fence: claimKey(t, e.cli, e.keys, "y")}
	if _, _, err := e.w.Append(ctx, y, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	setFull(t, e)
	ws := []stream.Write{{C: y, End: stream.AttemptEnded}}
	for i := range 3 {
		c := stream.Claim{Task: "t", Attempt: i + 1, Fence: openFence{token: int64(i + 1)}}
		ws = append(ws, stream.Write{C: c, Events: []stream.Input{{Type: "lost"}}})
	}
	errs := stream.FlushBatch(ctx, e.w, ws)
	if errs[0] != nil {
		t.Fatalf("the end: %v, want it written", errs[0])
	}
	for i, err := range errs[1:] {
		if !errors.Is(err, drover.ErrStoreFull) {
			t.Fatalf("attempt %d's events: %v, want ErrStoreFull", i+1, err)
		}
	}
	if got, want := types(t, e, "y"), []string{stream.AttemptStarted, "log", stream.AttemptEnded}; !slices.Equal(got, want) {
		t.Fatalf("stream y is %v, want %v", got, want)
	}
}

// TestFullStoreEndMakesNoStream: an attempt every emit of which a full
// store refused ends without writing anything: its end would make the
// stream (attempt_started, attempt_ended, an expiry key). So for an end
// in the same batch as the refused events.
func TestFullStoreEndMakesNoStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	setFull(t, e)
	a := stream.Claim{Task: "a", Attempt: 1, Fence: claimKey(t, e.cli, e.keys, "a")}
	_, at := stream.Begin(ctx, e.cli, e.keys, a, false)
	if err := at.Emit(ctx, stream.Input{Type: "lost"}); err != nil {
		t.Fatal(err)
	}
	if err := at.Flush(ctx); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("flush: %v, want ErrStoreFull", err)
	}
	if err := at.End(ctx, stream.AttemptEnded, "failed", nil); err != nil {
		t.Fatalf("end: %v", err)
	}
	b := stream.Claim{Task: "b", Attempt: 1, Fence: claimKey(t, e.cli, e.keys, "b")}
	errs := stream.FlushBatch(ctx, e.w, []stream.Write{{C: b, Events: []stream.Input{{Type: "lost"}}}, {C: b, End: stream.AttemptEnded}})
	if !errors.Is(errs[0], drover.ErrStoreFull) || errs[1] != nil {
		t.Fatalf("errors %v, want ErrStoreFull for the events and none for the end", errs)
	}
	r, err := e.cli.Get(ctx, e.keys.Root(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range r.Kvs {
		if k := string(kv.Key); strings.Contains(k, "stream") {
			t.Fatalf("the full store took key %s", k)
		}
	}
}

// TestCapRefusesBeforeTheBoundary: a new attempt's first write past the
// stream's cap is refused with nothing written, not even its
// attempt_started (or the attempt_lost of the one before).
func TestCapRefusesBeforeTheBoundary(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{MaxEvents: 2})
	ctx := context.Background()
	const id = "capped"
	c1 := claimKey(t, e.cli, e.keys, id)
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: id, Attempt: 1, Fence: c1}, []stream.Input{{Type: "a"}, {Type: "b"}}); err != nil {
		t.Fatal(err)
	}
	lose(t, e.cli, c1)
	c2 := claimKey2(t, e, id)
	last0, err := e.hub.LastSeq(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: id, Attempt: 2, Fence: c2}, []stream.Input{{Type: "c"}}); !errors.Is(err, stream.ErrStreamFull) {
		t.Fatalf("a write past the cap: %v, want ErrStreamFull", err)
	}
	if last, err := e.hub.LastSeq(ctx, id); err != nil || last != last0 {
		t.Fatalf("the stream's last event is %d (%v) after a refused write, want %d: the boundary was written", last, err, last0)
	}
}
