package stream_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func text(i int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)) }

// checkSeq fails unless evs are numbered from, from+1, ... with no gap.
func checkSeq(t *testing.T, evs []stream.Event, from int64) {
	t.Helper()
	for i, ev := range evs {
		if ev.Seq != from+int64(i) {
			t.Fatalf("event %d has seq %d, want %d: %+v", i, ev.Seq, from+int64(i), evs)
		}
	}
}

func TestFollowSeesTheSameSequenceFromAnyPoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id = "task-1"
	early := make(chan []stream.Event)
	go func() { early <- collect(t, e.hub, id, 0, 0) }() // before the task starts
	c := claimKey(t, e.cli, e.keys, id)
	actx, at := stream.Begin(ctx, e.cli, e.keys, stream.Claim{Task: id, Attempt: 1, Worker: "w1", Fence: c}, false)
	for i := 1; i <= 10; i++ {
		if err := stream.Emit(actx, "progress", text(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := at.End(ctx, stream.Done, "succeeded", nil); err != nil {
		t.Fatal(err)
	}
	all := <-early
	if len(all) != 12 || all[0].Type != stream.AttemptStarted || all[11].Type != stream.Done {
		t.Fatalf("a follower from before the start saw %d events: %+v", len(all), all)
	}
	checkSeq(t, all, 1)
	for i, ev := range all[1:11] {
		if ev.Type != "progress" || string(ev.Data) != string(text(i+1)) || ev.Attempt != 1 {
			t.Fatalf("event %d: %+v", i+2, ev)
		}
	}
	for from := int64(0); from <= 12; from++ { // after the end, from every point
		got := collect(t, e.hub, id, from, 0)
		want := all[max(from, 1)-1:]
		if len(got) != len(want) {
			t.Fatalf("from %d: %d events, want %d", from, len(got), len(want))
		}
		checkSeq(t, got, max(from, 1))
	}
}

func TestStaleAttemptIsFencedAtTheBoundary(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id = "task-2"
	c1 := claimKey(t, e.cli, e.keys, id)
	a1 := stream.Claim{Task: id, Attempt: 1, Worker: "w1", Fence: c1}
	if _, _, err := e.w.Append(ctx, a1, []stream.Input{{Type: "log", Data: text(1)}, {Type: "log", Data: text(2)}}); err != nil {
		t.Fatal(err)
	}
	lose(t, e.cli, c1) // the claim is gone: the next emit is fenced at once
	if _, _, err := e.w.Append(ctx, a1, []stream.Input{{Type: "log", Data: text(3)}}); !errors.Is(err, stream.ErrFenced) {
		t.Fatalf("emit after the claim's loss: %v, want ErrFenced", err)
	}
	c2 := claimKey(t, e.cli, e.keys, id)
	a2 := stream.Claim{Task: id, Attempt: 2, Worker: "w2", Fence: c2}
	if _, _, err := e.w.Append(ctx, a2, []stream.Input{{Type: "log", Data: text(4)}}); err != nil {
		t.Fatal(err)
	}
	// A stale writer whose compares would pass (it kept the key's token
	// by a fluke) is still refused: a later attempt wrote the stream.
	stale := stream.Claim{Task: id, Attempt: 1, Worker: "w1", Fence: &keyClaim{key: c2.key, token: c1.token}}
	if _, _, err := e.w.Append(ctx, stale, []stream.Input{{Type: "log", Data: text(5)}}); !errors.Is(err, stream.ErrFenced) {
		t.Fatalf("emit of the stale attempt after the boundary: %v, want ErrFenced", err)
	}
	got := collect(t, e.hub, id, 1, 6)
	want := []string{stream.AttemptStarted, "log", "log", stream.AttemptLost, stream.AttemptStarted, "log"}
	for i, ev := range got {
		if ev.Type != want[i] {
			t.Fatalf("event %d is %s, want %s: %+v", i+1, ev.Type, want[i], got)
		}
	}
	checkSeq(t, got, 1)
	if got[5].Attempt != 2 || string(got[5].Data) != string(text(4)) {
		t.Fatalf("after the boundary: %+v", got[5])
	}
}

func TestRacingStaleAttemptWritesNothingAfterTheBoundary(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id = "task-3"
	c1 := claimKey(t, e.cli, e.keys, id)
	a1 := stream.Claim{Task: id, Attempt: 1, Fence: c1}
	stopped := make(chan int)
	go func() { // attempt 1 emits until it is fenced
		n := 0
		for ; ; n++ {
			if _, _, err := e.w.Append(ctx, a1, []stream.Input{{Type: "log", Data: text(n)}}); err != nil {
				if !errors.Is(err, stream.ErrFenced) {
					t.Errorf("stale emit: %v", err)
				}
				stopped <- n
				return
			}
			if n == 20 { // as lose does, with t.Errorf: not the test's goroutine
				if _, err := e.cli.Revoke(context.Background(), c1.lease); err != nil {
					t.Errorf("revoke: %v", err)
				}
			}
		}
	}()
	c2 := claimKey2(t, e, id)
	a2 := stream.Claim{Task: id, Attempt: 2, Fence: c2}
	if _, _, err := e.w.Append(ctx, a2, []stream.Input{{Type: "log", Data: text(-1)}}); err != nil {
		t.Fatal(err)
	}
	n := <-stopped
	// attempt_started, n of attempt 1, attempt_lost, attempt_started, 1.
	got := collect(t, e.hub, id, 1, n+4)
	boundary := -1
	for i, ev := range got {
		if ev.Type == stream.AttemptLost {
			boundary = i
		}
		if boundary >= 0 && ev.Attempt == 1 {
			t.Fatalf("event %d of attempt 1 after the boundary at %d", ev.Seq, boundary+1)
		}
	}
	if boundary < 0 || boundary != n+1 {
		t.Fatalf("boundary at %d, after %d stored events of attempt 1: %+v", boundary, n, got)
	}
	checkSeq(t, got, 1)
}

// claimKey2 waits for task id's claim key to be free, and takes it.
func claimKey2(t *testing.T, e env, id string) *keyClaim {
	t.Helper()
	key := e.keys.Root() + "claims/" + id
	w := e.cli.Watch(context.Background(), key)
	for {
		if r, err := e.cli.Get(context.Background(), key); err == nil && len(r.Kvs) == 0 {
			return claimKey(t, e.cli, e.keys, id)
		}
		<-w
	}
}

func TestCapsRefuseWholeWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{MaxEvents: 5, MaxBytes: 1000, MaxEventBytes: 200})
	ctx := context.Background()
	const id = "task-4"
	a := stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}
	big := json.RawMessage(`"` + string(make([]byte, 300)) + `"`)
	for i := range big[1 : len(big)-1] {
		big[i+1] = 'x'
	}
	if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "log", Data: big}}); !errors.Is(err, stream.ErrStreamFull) {
		t.Fatalf("an event over the event cap: %v, want ErrStreamFull", err)
	}
	if first, last, err := e.w.Append(ctx, a, []stream.Input{{Type: "a"}, {Type: "b"}, {Type: "c"}}); err != nil || first != 2 || last != 4 {
		t.Fatalf("three events: %d..%d, %v", first, last, err)
	}
	if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "d"}, {Type: "e"}, {Type: "f"}}); !errors.Is(err, stream.ErrStreamFull) {
		t.Fatalf("three more past 5 events: %v, want ErrStreamFull", err)
	}
	if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "d"}, {Type: "e"}}); err != nil {
		t.Fatalf("two more, up to the cap: %v", err)
	}
	if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "bad", Data: json.RawMessage(`{`)}}); err == nil {
		t.Fatal("an event whose data is not JSON was stored")
	}
	got := collect(t, e.hub, id, 1, 6)
	for i, typ := range []string{stream.AttemptStarted, "a", "b", "c", "d", "e"} {
		if got[i].Type != typ {
			t.Fatalf("event %d is %s, want %s", i+1, got[i].Type, typ)
		}
	}
}

func TestEmitQueuesWhileAWriteIsUnderWay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id, n = "task-5", 500
	actx, at := stream.Begin(ctx, e.cli, e.keys, stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}, false)
	for i := range n {
		if err := stream.Emit(actx, "token", text(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Flush(actx); err != nil {
		t.Fatal(err)
	}
	r, err := e.cli.Get(ctx, e.keys.StreamChunks(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if r.Count < 1 || r.Count >= n {
		t.Fatalf("%d events in %d chunks: the emits did not wait together", n, r.Count)
	}
	if err := at.End(ctx, stream.Done, "succeeded", nil); err != nil {
		t.Fatal(err)
	}
	got := collect(t, e.hub, id, 1, 0)
	if len(got) != n+2 {
		t.Fatalf("%d events, want %d", len(got), n+2)
	}
	checkSeq(t, got, 1)
	for i, ev := range got[1 : n+1] {
		if string(ev.Data) != string(text(i)) {
			t.Fatalf("event %d: %s, want %s", i+2, ev.Data, text(i))
		}
	}
	t.Logf("%d events in %d chunks", n, r.Count)
}

// TestWritersOfOneStreamKeepItsOrder: two processes writing one
// attempt's stream (two servers taking an external worker's posts) never
// overwrite each other: the second, whose view is stale, reads the
// stream again and writes after; and a writer whose claim's compares
// still hold but whose stream a later attempt wrote is fenced.
func TestWritersOfOneStreamKeepItsOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	other := stream.NewWriter(e.cli, e.keys, stream.Limits{}, time.Millisecond)
	ctx := context.Background()
	const id = "task-6"
	a := stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}
	for i := range 6 {
		w := e.w
		if i%2 == 1 {
			w = other
		}
		first, last, err := w.Append(ctx, a, []stream.Input{{Type: "log", Data: text(i)}, {Type: "log", Data: text(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(2 + 2*i); first != want || last != want+1 {
			t.Fatalf("write %d stored %d..%d, want %d..%d", i, first, last, want, want+1)
		}
	}
	// A later attempt writes (its claim on another key, as a claim taken
	// again would be); the first attempt's compares still hold.
	later := stream.Claim{Task: id, Attempt: 2, Fence: claimKey(t, e.cli, e.keys, id+"-again")}
	if later.Fence.Token() <= a.Fence.Token() {
		t.Fatal("the later claim's token is not higher")
	}
	if _, _, err := other.Append(ctx, later, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "log"}}); !errors.Is(err, stream.ErrFenced) {
		t.Fatalf("the earlier attempt after the later one wrote: %v, want ErrFenced", err)
	}
	got := collect(t, e.hub, id, 1, 16)
	checkSeq(t, got, 1)
	if got[13].Type != stream.AttemptLost || got[14].Type != stream.AttemptStarted || got[15].Attempt != 2 {
		t.Fatalf("the boundary: %+v", got[13:])
	}
}

// TestDoneOpIsOfTheStoredEnd: an attempt's DoneOp is made from where End
// stored its attempt_ended, not from the Writer's state of the attempt,
// which a send of events queued before End and sent after it (its
// outbox still sending when End's wait for it was over) reads and sets
// on another goroutine: that send is fenced, and the done still goes
// with the task's end, right after attempt_ended.
func TestDoneOpIsOfTheStoredEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	const id = "doneop-1"
	c1 := claimKey(t, e.cli, e.keys, id)
	ctx, at := stream.Begin(context.Background(), e.cli, e.keys, stream.Claim{Task: id, Attempt: 1, Worker: "w1", Fence: c1}, false)
	if err := stream.Emit(ctx, "log", 1); err != nil {
		t.Fatal(err)
	}
	if err := at.End(ctx, stream.AttemptEnded, "succeeded", nil); err != nil {
		t.Fatal(err)
	}
	if err := stream.SendQueued(at, []stream.Input{{Type: "log", Data: text(2)}}); !errors.Is(err, stream.ErrFenced) {
		t.Fatalf("events sent after the attempt's end: %v, want ErrFenced", err)
	}
	op, ok := at.DoneOp("succeeded", "")
	if !ok {
		t.Fatal("no done for an attempt whose attempt_ended is stored")
	}
	if _, err := e.cli.Txn(ctx).Then(op).Commit(); err != nil {
		t.Fatal(err)
	}
	evs := collect(t, e.hub, id, 1, 4)
	checkSeq(t, evs, 1)
	if len(evs) != 4 || evs[2].Type != stream.AttemptEnded || evs[3].Type != stream.Done {
		t.Fatalf("the stream holds %+v, want attempt_started, log, attempt_ended, done", evs)
	}
}
