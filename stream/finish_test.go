package stream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestDoneFollowedByEventsIsNotFinal: a Done that later events follow
// (the task ran again) does not end a follower; the last Done does.
func TestDoneFollowedByEventsIsNotFinal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id = "again"
	c1 := claimKey(t, e.cli, e.keys, id)
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: id, Attempt: 1, Fence: c1}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.w.Finish(ctx, id, "succeeded", ""); err != nil {
		t.Fatal(err)
	}
	lose(t, e.cli, c1)
	c2 := claimKey(t, e.cli, e.keys, id)
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: id, Attempt: 2, Fence: c2}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.w.Finish(ctx, id, "succeeded", ""); err != nil {
		t.Fatal(err)
	}
	got := collect(t, e.hub, id, 1, 100)
	var types []string
	for _, ev := range got {
		types = append(types, ev.Type)
	}
	want := []string{stream.AttemptStarted, "log", stream.Done, stream.AttemptStarted, "log", stream.Done}
	if len(types) != len(want) {
		t.Fatalf("followed %v, want %v", types, want)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("followed %v, want %v", types, want)
		}
	}
}

// TestFinishIsIdempotent: a second Finish, and a Finish of a stream
// without events, write nothing.
func TestFinishIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	c := claimKey(t, e.cli, e.keys, "f")
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: "f", Attempt: 1, Fence: c}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := e.w.Finish(ctx, "f", "cancelled", ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.w.Finish(ctx, "none", "cancelled", ""); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int64{"f": 3, "none": 0} {
		last, err := e.hub.LastSeq(ctx, id)
		if err != nil || last != want {
			t.Fatalf("%s: last event %d (%v), want %d", id, last, err, want)
		}
	}
}

// TestTwoAttemptsOfOneTaskInOneBatch: two attempts of one task taken in
// one batch never both take the same place: the stream's chunks do not
// overlap, and its events are numbered 1, 2, ... once each.
func TestTwoAttemptsOfOneTaskInOneBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id = "twice"
	c1 := claimKey(t, e.cli, e.keys, id)
	lose(t, e.cli, c1)
	c2 := claimKey(t, e.cli, e.keys, id)
	// c1 is gone but its fence does not know: the claim compare alone
	// would refuse it; a fence without compares shows the batch's own.
	claims := []stream.Claim{{Task: id, Attempt: 1, Fence: openFence{1}}, {Task: id, Attempt: 2, Fence: openFence{c2.token}}}
	errs := stream.FlushTogether(ctx, e.w, claims, stream.Input{Type: "log"})
	landed := 0
	for _, err := range errs {
		if err == nil {
			landed++
		}
	}
	if landed == 0 {
		t.Fatalf("no attempt landed: %v", errs)
	}
	resp, err := e.cli.Get(ctx, e.keys.StreamChunks(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != int64(landed) {
		t.Fatalf("%d chunks for %d writes that landed (%v)", resp.Count, landed, errs)
	}
	i := int64(0)
	err = e.hub.Read(ctx, id, 1, func(list []stream.Event) bool {
		for _, ev := range list {
			if i++; ev.Seq != i {
				t.Errorf("event %d has seq %d", i, ev.Seq)
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
}

// openFence holds always: a claim whose compares cannot refuse.
type openFence struct{ token int64 }

func (f openFence) Token() int64             { return f.token }
func (f openFence) Compares() []clientv3.Cmp { return nil }
func (f openFence) Err() error               { return nil }

// TestFollowEndsWhenItsTaskEnded: a follower of a stream without Done
// ends once its task ended (WhenEnded) and it has every stored event:
// a stream without events at the first check, one with events at the
// second (the first may come while the task's Done is on its way).
func TestFollowEndsWhenItsTaskEnded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	c := claimKey(t, e.cli, e.keys, "cut")
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: "cut", Attempt: 1, Fence: c}, []stream.Input{{Type: "log"}, {Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		id        string
		n, checks int
	}{{"cut", 3, 2}, {"empty", 0, 1}} {
		fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		asked := 0
		n := 0
		ended := stream.WhenEnded(func(context.Context) bool { asked++; return true }, time.Millisecond)
		for _, err := range e.hub.Follow(fctx, x.id, 1, ended, stream.SettleAfter(time.Nanosecond)) {
			if err != nil {
				t.Fatal(err)
			}
			n++
		}
		if fctx.Err() != nil || n != x.n || asked != x.checks {
			t.Fatalf("follow %s: %d events, asked %d times, timed out %v; want %d, %d, false", x.id, n, asked, fctx.Err() != nil, x.n, x.checks)
		}
		cancel()
	}
}

// TestFollowGetsTheDoneWrittenAfterItsTaskEnded: a task's Done is written
// after its outcome is stored, so a follower may find the task ended
// while the Done is not stored yet. It does not end then: the Done,
// stored before its next check (forced here: the check writes it), is
// the last event it gives. Without the wait, it ended with no Done.
func TestFollowGetsTheDoneWrittenAfterItsTaskEnded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	c := claimKey(t, e.cli, e.keys, "late")
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: "late", Attempt: 1, Fence: c}, []stream.Input{{Type: "token"}}); err != nil {
		t.Fatal(err)
	}
	lose(t, e.cli, c) // the outcome is stored: the claim is gone
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	asked := 0
	ended := stream.WhenEnded(func(ctx context.Context) bool {
		if asked++; asked == 2 { // the Done lands while the follower waits
			if err := e.w.Finish(ctx, "late", "succeeded", ""); err != nil {
				t.Error(err)
			}
		}
		return true
	}, time.Millisecond)
	var got []string
	for ev, err := range e.hub.Follow(fctx, "late", 1, ended, stream.SettleAfter(time.Nanosecond)) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.Type)
	}
	want := []string{stream.AttemptStarted, "token", stream.Done}
	if fctx.Err() != nil || !slices.Equal(got, want) {
		t.Fatalf("follower got %v (asked %d times, timed out %v), want %v", got, asked, fctx.Err() != nil, want)
	}
}

// TestEndedClaimWritesNoMore: once a claim's attempt ended (End with
// attempt_ended, or the task's Finish), a later write under the same
// claim is fenced and nothing follows the end.
func TestEndedClaimWritesNoMore(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	for _, how := range []string{"end", "finish"} {
		id := "ended-" + how
		c := stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}
		if _, _, err := e.w.Append(ctx, c, []stream.Input{{Type: "log"}}); err != nil {
			t.Fatal(err)
		}
		var err error
		if how == "end" {
			err = e.w.End(ctx, c, stream.AttemptEnded, "waiting", nil)
		} else {
			err = e.w.Finish(ctx, id, "succeeded", "")
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.w.Append(ctx, c, []stream.Input{{Type: "late"}}); !errors.Is(err, stream.ErrFenced) {
			t.Fatalf("%s: a write after the claim's end: %v, want ErrFenced", how, err)
		}
		if err := e.w.End(ctx, c, stream.AttemptEnded, "again", nil); !errors.Is(err, stream.ErrFenced) {
			t.Fatalf("%s: a second end of the claim: %v, want ErrFenced", how, err)
		}
		got := collect(t, e.hub, id, 1, 3)
		if last, err := e.hub.LastSeq(ctx, id); err != nil || last != 3 || !slices.Contains([]string{stream.AttemptEnded, stream.Done}, got[2].Type) {
			t.Fatalf("%s: stream %v ends at %d (%v), want 3 events ending with the end", how, got, last, err)
		}
	}
}

// TestFollowChecksAgainWhenTheWaitIsOver: a follower that found its task
// ended with no Done checks again once its wait for a late Done is over,
// not at its next idle check an interval (here an hour) later.
func TestFollowChecksAgainWhenTheWaitIsOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	c := claimKey(t, e.cli, e.keys, "recheck")
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: "recheck", Attempt: 1, Fence: c}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	asked, n := 0, 0
	ended := stream.WhenEnded(func(context.Context) bool { asked++; return true }, time.Hour)
	for _, err := range e.hub.Follow(fctx, "recheck", 1, ended, stream.SettleAfter(50*time.Millisecond)) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if fctx.Err() != nil || n != 2 || asked != 2 {
		t.Fatalf("follow: %d events, asked %d times, timed out %v; want 2, 2, false", n, asked, fctx.Err() != nil)
	}
}

// TestFollowWaitsForALateDoneFromTheTasksEnd: with WhenEndedAt, the wait
// for a late Done counts from the task's end: a follower of a task that
// ended longer ago than the wait ends at its first check; one of a task
// that just ended waits; an end time ahead of the follower's clock
// waits no longer than the wait itself.
func TestFollowWaitsForALateDoneFromTheTasksEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	c := claimKey(t, e.cli, e.keys, "old")
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: "old", Attempt: 1, Fence: c}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		name          string
		end           time.Duration // from now
		settle, limit time.Duration
		checks        int
		timedOut      bool
	}{
		{"ended two hours ago", -2 * time.Hour, time.Hour, 20 * time.Second, 1, false},
		{"just ended", 0, time.Hour, 300 * time.Millisecond, 1, true},
		{"ended an hour ahead", time.Hour, 100 * time.Millisecond, 20 * time.Second, 2, false},
	} {
		fctx, cancel := context.WithTimeout(ctx, x.limit)
		asked, n := 0, 0
		at := time.Now().Add(x.end)
		ended := stream.WhenEndedAt(func(context.Context) (time.Time, bool) { asked++; return at, true }, time.Hour)
		for _, err := range e.hub.Follow(fctx, "old", 1, ended, stream.SettleAfter(x.settle)) {
			if err != nil {
				t.Fatal(err)
			}
			n++
		}
		if timedOut := fctx.Err() != nil; timedOut != x.timedOut || n != 2 || asked != x.checks {
			t.Fatalf("%s: %d events, asked %d times, timed out %v; want 2, %d, %v", x.name, n, asked, timedOut, x.checks, x.timedOut)
		}
		cancel()
	}
}

// TestEndedThroughAnotherWriter: the end of an attempt whose claim is
// gone (an external worker's retry, acknowledged on a server other
// than the one its events went through) is written by any process's
// writer, as the attempt that wrote the stream's last events; not by
// a claim that did not write them, and not twice.
func TestEndedThroughAnotherWriter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	other := stream.NewWriter(e.cli, e.keys, stream.Limits{}, time.Millisecond) // another server's
	ctx := context.Background()
	const id = "elsewhere"
	c1 := claimKey(t, e.cli, e.keys, id)
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: id, Attempt: 3, Fence: c1}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	lose(t, e.cli, c1) // the outcome took the claim
	if err := other.Ended(ctx, id, c1.token+1, stream.AttemptEnded, "retrying", ""); err != nil {
		t.Fatal(err) // a claim that did not write the stream's last events: nothing
	}
	for range 2 {
		if err := other.Ended(ctx, id, c1.token, stream.AttemptEnded, "retrying", "flaky"); err != nil {
			t.Fatal(err)
		}
	}
	last, err := e.hub.LastSeq(ctx, id)
	if err != nil || last != 3 {
		t.Fatalf("the stream's last event is %d (%v), want 3: one end, once", last, err)
	}
	got := collect(t, e.hub, id, 1, 3)
	if len(got) != 3 || got[2].Type != stream.AttemptEnded || got[2].Attempt != 3 || !strings.Contains(string(got[2].Data), `"flaky"`) {
		t.Fatalf("followed %v, want attempt_started, log, attempt_ended of attempt 3 (the claim's, \"flaky\")", got)
	}
}

// TestEndedAfterALaterAttemptWrites: the end of an attempt whose outcome
// was stored, written late (its server slow), after the task's next
// attempt began to write, writes nothing: it does not end the later
// attempt, which goes on writing.
func TestEndedAfterALaterAttemptWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id = "late-end"
	c1 := claimKey(t, e.cli, e.keys, id)
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: id, Attempt: 1, Fence: c1}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	lose(t, e.cli, c1) // its outcome: retrying
	c2 := claimKey(t, e.cli, e.keys, id)
	later := stream.Claim{Task: id, Attempt: 2, Fence: c2}
	if _, _, err := e.w.Append(ctx, later, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	other := stream.NewWriter(e.cli, e.keys, stream.Limits{}, time.Millisecond)
	if err := other.Ended(ctx, id, c1.token, stream.AttemptEnded, "retrying", ""); err != nil {
		t.Fatal(err)
	}
	if _, last, err := e.w.Append(ctx, later, []stream.Input{{Type: "log"}}); err != nil || last != 6 {
		t.Fatalf("the later attempt's next write: last %d, %v; want 6, stored", last, err)
	}
	got := collect(t, e.hub, id, 1, 6)
	types := make([]string, len(got))
	for i, ev := range got {
		types[i] = ev.Type
	}
	if want := "attempt_started log attempt_lost attempt_started log log"; strings.Join(types, " ") != want {
		t.Fatalf("followed %v, want %s", types, want)
	}
}

// TestEndedByTwoWritersAtOnce: two processes that end the same attempt
// at once (the outcome's server and another) store one end.
func TestEndedByTwoWritersAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	writers := []*stream.Writer{
		stream.NewWriter(e.cli, e.keys, stream.Limits{}, time.Millisecond),
		stream.NewWriter(e.cli, e.keys, stream.Limits{}, time.Millisecond),
	}
	for i := range 5 {
		id := fmt.Sprintf("twice-%d", i)
		c := claimKey(t, e.cli, e.keys, id)
		if _, _, err := e.w.Append(ctx, stream.Claim{Task: id, Attempt: 1, Fence: c}, []stream.Input{{Type: "log"}}); err != nil {
			t.Fatal(err)
		}
		lose(t, e.cli, c)
		var wg sync.WaitGroup
		errs := make([]error, len(writers))
		for k, w := range writers {
			wg.Go(func() { errs[k] = w.Ended(ctx, id, c.token, stream.AttemptEnded, "retrying", "") })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if last, err := e.hub.LastSeq(ctx, id); err != nil || last != 3 {
			t.Fatalf("%s: the last event is %d (%v), want 3: one end", id, last, err)
		}
	}
}

// TestEndedOfTokenZero: Ended of a claim token 0 is a claim like any
// other: it writes nothing on a stream another claim wrote last.
func TestEndedOfTokenZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id = "token-zero"
	c := claimKey(t, e.cli, e.keys, id)
	if _, _, err := e.w.Append(ctx, stream.Claim{Task: id, Attempt: 1, Fence: c}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	if err := e.w.Ended(ctx, id, 0, stream.AttemptEnded, "retrying", ""); err != nil {
		t.Fatal(err)
	}
	if last, err := e.hub.LastSeq(ctx, id); err != nil || last != 2 {
		t.Fatalf("the last event is %d (%v), want 2: nothing written", last, err)
	}
}
