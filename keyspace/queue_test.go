package keyspace_test

import (
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
)

// TestQueueKeysRoundTrip: every queue key keyspace builds parses back to
// what built it, ids with '-' and ':' included, and others are refused.
func TestQueueKeysRoundTrip(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("ns")
	at := time.Unix(0, 1763820000123456789)
	for _, p := range []keyspace.Pending{{Shard: 0, Level: 0, Submitted: at, ID: "a"}, {Shard: 511, Level: 1000, Submitted: at, ID: "job-1:x-2"}} {
		key := s.PendingKey("q", p)
		got, ok := s.ParsePendingKey("q", key)
		if !ok || got.Shard != p.Shard || got.Level != p.Level || !got.Submitted.Equal(p.Submitted) || got.ID != p.ID {
			t.Fatalf("%s parsed as %+v, %t; want %+v", key, got, ok, p)
		}
		if order := s.PendingOrder("q", key); order != keyspace.LevelName(p.Level)+"1763820000123456789-"+p.ID {
			t.Fatalf("order %q", order)
		}
	}
	for _, bad := range []string{"/ns/queues/q/pending/", "/ns/queues/q/pending/01/x", "/ns/queues/r/pending/000/0000" + "1763820000123456789-a", "/ns/queues/q/claims/a"} {
		if _, ok := s.ParsePendingKey("q", bad); ok {
			t.Fatalf("%q parsed as a pending key", bad)
		}
	}
	for _, key := range []string{s.QueueRetryKey("q", at, "t-1"), s.QueueDoneKey("q", "SUCCEEDED", at, "t-1")} {
		prefix := key[:len(key)-len("1763820000123456789-t-1")]
		ns, id, ok := keyspace.ParseTimedKey(prefix, key)
		if !ok || ns != at.UnixNano() || id != "t-1" {
			t.Fatalf("%s parsed as %d %q %t", key, ns, id, ok)
		}
		if keyspace.TimeBound(prefix, at.UnixNano()) >= key || keyspace.TimeBound(prefix, at.UnixNano()+1) <= key {
			t.Fatalf("time bounds do not bracket %s", key)
		}
	}
	if _, _, ok := keyspace.ParseTimedKey(s.QueueRetry("q"), s.QueueRetry("q")+"12-x"); ok {
		t.Fatal("a short time parsed")
	}
	if id, ok := keyspace.Last(s.QueueClaims("q"), s.QueueClaim("q", "t-1")); !ok || id != "t-1" {
		t.Fatalf("claim id %q %t", id, ok)
	}
	if _, ok := keyspace.Last(s.QueueClaims("q"), s.QueueClaims("q")+"a/b"); ok {
		t.Fatal("a nested key read as a claim")
	}
}

// TestSegmentKeysRoundTrip: segment names carry their level and sort by
// level, then time; a task's place and the parts of a segment's state keys
// parse back to what built them; others are refused.
func TestSegmentKeysRoundTrip(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("ns")
	at := time.Unix(0, 1763820000123456789)
	name := keyspace.SegmentName(37, at, "abcdef12")
	if lv, ok := keyspace.SegmentLevel(name); !ok || lv != 37 {
		t.Fatalf("level of %s: %d, %t", name, lv, ok)
	}
	if later := keyspace.SegmentName(37, at.Add(time.Nanosecond), "00000000"); later <= name {
		t.Fatalf("%s sorts before %s", later, name)
	}
	if higher := keyspace.SegmentName(36, at.Add(time.Hour), "ffffffff"); higher >= name {
		t.Fatalf("a higher priority (level 36) sorts after level 37: %s", higher)
	}
	if _, ok := keyspace.SegmentLevel("x"); ok {
		t.Fatal("x parsed as a segment name")
	}
	p := keyspace.TaskPlace{Queue: "q-1", Segment: name, Slot: 99}
	if got, ok := keyspace.ParseTaskPlace(p.String()); !ok || got != p {
		t.Fatalf("%s parsed as %+v, %t", p, got, ok)
	}
	for _, bad := range []string{"", "q/seg", "q//1", "q/seg/-1", "q/seg/x", "/seg/1"} {
		if _, ok := keyspace.ParseTaskPlace(bad); ok {
			t.Fatalf("%q parsed as a place", bad)
		}
	}
	for _, pre := range []string{s.Runs("q", ""), s.Tries("q", ""), s.Outs("q", ""), s.Exits("q", "")} {
		key := pre + name + "/003-w-1"
		seg, rest, ok := keyspace.SegmentPart(pre, key)
		if !ok || seg != name || rest != "003-w-1" {
			t.Fatalf("%s split as %q %q %t", key, seg, rest, ok)
		}
		if _, _, ok := keyspace.SegmentPart(pre, pre+name); ok {
			t.Fatalf("%s split without a rest", pre+name)
		}
	}
	if k := s.Exit("q", name, 7); k != s.Exits("q", name)+"007" || s.ExitDone("q", name, 7) != k+"-ok" {
		t.Fatalf("exit keys %s %s", k, s.ExitDone("q", name, 7))
	}
}

// TestSegmentStateNamesRoundTrip: run, outcome and exit names, and segment
// names, parse back to what built them; others are refused.
func TestSegmentStateNamesRoundTrip(t *testing.T) {
	t.Parallel()
	if n := keyspace.RunSlots(keyspace.RunName(42, "w-1:x", 7)); n != 42 {
		t.Fatalf("run slots %d", n)
	}
	token, ok, moved, valid := keyspace.ParseOutName(keyspace.OutName(1234567, 98, 2, 3))
	if !valid || token != 1234567 || ok != 98 || moved != 2 {
		t.Fatalf("out name parsed as %d %d %d %t", token, ok, moved, valid)
	}
	if _, _, _, valid := keyspace.ParseOutName("x-1"); valid {
		t.Fatal("x-1 parsed as an outcome name")
	}
	// Outcome names sort by token, so a range from OutsFrom(rev) holds the
	// runs made at or after rev.
	s := keyspace.MustNew("ns")
	if from := s.OutsFrom("q", "seg", 1000); s.Outs("q", "seg")+keyspace.OutName(999, 1, 0, 1) >= from || s.Outs("q", "seg")+keyspace.OutName(1000, 1, 0, 1) < from {
		t.Fatalf("OutsFrom(1000) = %s does not split tokens 999 and 1000", from)
	}
	for name, want := range map[string][2]any{"007": {7, false}, "007-ok": {7, true}} {
		slot, done, ok := keyspace.ParseExit(name)
		if !ok || slot != want[0] || done != want[1] {
			t.Fatalf("exit %s parsed as %d %t %t", name, slot, done, ok)
		}
	}
	for _, bad := range []string{"7", "007-x", "abc"} {
		if _, _, ok := keyspace.ParseExit(bad); ok {
			t.Fatalf("%q parsed as an exit", bad)
		}
	}
	at := time.Unix(0, 1763820000123456789)
	lv, got, isName := keyspace.ParseSegmentName(keyspace.SegmentName(500, at, "abcdef12"))
	if !isName || lv != 500 || !got.Equal(at) {
		t.Fatalf("segment name parsed as %d %s %t", lv, got, isName)
	}
	if b := keyspace.SegmentBound("/p/", 500, at); b >= "/p/"+keyspace.SegmentName(500, at, "00000000") || b <= "/p/"+keyspace.SegmentName(500, at.Add(-1), "ffffffff") {
		t.Fatalf("bound %s is not the first key of segments submitted at %s", b, at)
	}
}

// The keys of a segment's runs, tries, outcomes and exits, and of a dead
// or cancelled task, are built and read back here only.
func TestSegmentRecordKeys(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("ns")
	name := keyspace.RunName(3, "w-1", 9)
	if k := s.Run("q", "seg", name); k != s.Runs("q", "seg")+name || keyspace.RunNameOf(s.Runs("q", "seg"), k) != name {
		t.Fatalf("run key %q does not give back %q", k, name)
	}
	if k := s.Try("q", "seg", name); k != s.Tries("q", "seg")+name || keyspace.RunNameOf(s.Tries("q", "seg"), k) != name {
		t.Fatalf("try key %q does not give back %q", k, name)
	}
	out := keyspace.OutName(42, 2, 1, 7)
	if k := s.Out("q", "seg", out); !strings.HasPrefix(k, s.RunOuts("q", "seg", 42)) || strings.HasPrefix(k, s.RunOuts("q", "seg", 4)) {
		t.Fatalf("outcome %q is not under its run's prefix %q alone", k, s.RunOuts("q", "seg", 42))
	}
	if slot, done, ok := s.ParseExitKey("q", "seg", s.ExitDone("q", "seg", 7)); !ok || slot != 7 || !done {
		t.Fatalf("exit key: slot %d done %v ok %v", slot, done, ok)
	}
	if _, _, ok := s.ParseExitKey("q", "other", s.Exit("q", "seg", 7)); ok {
		t.Fatal("an exit of another segment parsed")
	}
	if seg, ok := keyspace.OpenSegmentName(s.SegmentsOpen("q"), s.SegmentOpen("q", "0001")); !ok || seg != "0001" {
		t.Fatalf("open segment %q %v", seg, ok)
	}
	if _, ok := keyspace.OpenSegmentName(s.SegmentsOpen("q"), s.QueuePending("q")+"x"); ok {
		t.Fatal("a pending key read as an open segment")
	}
	if s.DeadTask("q", "t1") != s.QueueDead("q")+"t1" || s.CancelTask("q", "t1") != s.QueueCancel("q")+"t1" {
		t.Fatal("dead or cancel key off the layout")
	}
}
