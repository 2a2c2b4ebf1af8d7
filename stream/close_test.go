package stream_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/stream"
)

// TestEmitAfterEndIsRefused: once its attempt ended, a handler left
// running (abandoned after a timeout) emits nothing more: Emit fails
// with ErrFenced, and the stream ends with attempt_ended.
func TestEmitAfterEndIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	c := stream.Claim{Task: "ended", Attempt: 1, Fence: claimKey(t, e.cli, e.keys, "ended")}
	ectx, at := stream.Begin(ctx, e.cli, e.keys, c, false)
	if err := stream.Emit(ectx, "log", "before"); err != nil {
		t.Fatal(err)
	}
	if err := at.End(ctx, stream.AttemptEnded, "failed", nil); err != nil {
		t.Fatal(err)
	}
	if err := stream.Emit(ectx, "log", "after"); !errors.Is(err, stream.ErrFenced) {
		t.Fatalf("emit after end: %v, want ErrFenced", err)
	}
	if err := at.Flush(ctx); err != nil {
		t.Fatalf("flush after end: %v", err)
	}
	got := types(t, e, "ended")
	if want := []string{stream.AttemptStarted, "log", stream.AttemptEnded}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stream is %v, want %v", got, want)
	}
}

// TestWriterClose: Close sends the events emitted before it, waits for
// every goroutine of the Writer (the attempt's sender, the sweep its
// first write started), takes it out of For's registry, refuses later
// writes with ErrClosed, and may be called again.
func TestWriterClose(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	keys := keyspace.MustNew(etcdtest.Namespace(t))
	ctx := context.Background()
	w := stream.For(cli, keys)
	c := stream.Claim{Task: "closed", Attempt: 1, Fence: claimKey(t, cli, keys, "closed")}
	ectx, at := stream.Begin(ctx, cli, keys, c, false)
	const n = 200
	for i := range n {
		if err := stream.Emit(ectx, "log", i); err != nil {
			t.Fatal(err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := w.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if got := stream.WriterRunning(w); got != 0 {
		t.Fatalf("%d goroutines of the writer run after Close", got)
	}
	last, err := stream.NewHub(cli, keys).LastSeq(ctx, "closed")
	if err != nil || last != n+1 {
		t.Fatalf("last event %d (%v) after Close, want %d: Close did not wait for the emitted events", last, err, n+1)
	}
	if err := stream.Emit(ectx, "log", "late"); !errors.Is(err, stream.ErrClosed) {
		t.Fatalf("emit after Close: %v, want ErrClosed", err)
	}
	if _, _, err := w.Append(ctx, c, []stream.Input{{Type: "log"}}); !errors.Is(err, stream.ErrClosed) {
		t.Fatalf("append after Close: %v, want ErrClosed", err)
	}
	if err := at.End(ctx, stream.AttemptEnded, "failed", nil); !errors.Is(err, stream.ErrClosed) {
		t.Fatalf("end after Close: %v, want ErrClosed", err)
	}
	if err := w.Close(cctx); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if stream.For(cli, keys) == w {
		t.Fatal("For returned the closed writer")
	}
}

// TestHubClose: Close ends every follow open with ErrClosed, waits for
// the hub's watches, takes it out of HubFor's registry, refuses later
// follows, and may be called again.
func TestHubClose(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	keys := keyspace.MustNew(etcdtest.Namespace(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := stream.HubFor(cli, keys)
	ended := make(chan error, 1)
	go func() {
		var last error
		for _, err := range h.Follow(ctx, "followed", 1) {
			last = err
		}
		ended <- last
	}()
	for stream.Followers(h, "followed") == 0 { // bounded by ctx: the follow fails the test below
		select {
		case <-ctx.Done():
			t.Fatal("the follow never opened its watch")
		case <-time.After(time.Millisecond):
		}
	}
	if got := stream.HubRunning(h); got != 1 {
		t.Fatalf("%d goroutines of the hub, want 1 (the watch)", got)
	}
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := stream.HubRunning(h); got != 0 || h.Watching() != 0 {
		t.Fatalf("%d goroutines and %d watches of the hub after Close, want none", got, h.Watching())
	}
	if err := <-ended; !errors.Is(err, stream.ErrClosed) {
		t.Fatalf("the open follow ended with %v, want ErrClosed", err)
	}
	if err := followErr(ctx, h, "followed"); !errors.Is(err, stream.ErrClosed) {
		t.Fatalf("a follow after Close: %v, want ErrClosed", err)
	}
	if err := h.Close(ctx); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if stream.HubFor(cli, keys) == h {
		t.Fatal("HubFor returned the closed hub")
	}
}

// TestCloseAll closes the writers and hubs of one client, of every
// namespace, and not another client's.
func TestCloseAll(t *testing.T) {
	t.Parallel()
	cli, other := srv.Client(t), srv.Client(t)
	ns := etcdtest.Namespace(t)
	k1, k2 := keyspace.MustNew(ns+"-1"), keyspace.MustNew(ns+"-2")
	w1, w2, h1, kept := stream.For(cli, k1), stream.For(cli, k2), stream.HubFor(cli, k1), stream.For(other, k1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := stream.CloseAll(ctx, cli); err != nil {
		t.Fatal(err)
	}
	c := stream.Claim{Task: "x", Attempt: 1, Fence: openFence{token: 1}}
	for i, w := range []*stream.Writer{w1, w2} {
		if _, _, err := w.Append(ctx, c, []stream.Input{{Type: "log"}}); !errors.Is(err, stream.ErrClosed) {
			t.Fatalf("writer %d after CloseAll: %v, want ErrClosed", i+1, err)
		}
	}
	if err := followErr(ctx, h1, "x"); !errors.Is(err, stream.ErrClosed) {
		t.Fatalf("hub after CloseAll: %v, want ErrClosed", err)
	}
	if stream.For(other, k1) != kept {
		t.Fatal("CloseAll closed another client's writer")
	}
	if _, _, err := kept.Append(ctx, c, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatalf("another client's writer: %v", err)
	}
}

// followErr follows task id's stream and returns the first thing it
// yields as an error (nil if it yields none).
func followErr(ctx context.Context, h *stream.Hub, id string) error {
	for ev, err := range h.Follow(ctx, id, 1) {
		if err == nil {
			return fmt.Errorf("followed event %d", ev.Seq)
		}
		return err
	}
	return nil
}
