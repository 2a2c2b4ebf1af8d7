package keyspace_test

import (
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
)

// TestQueueKeysRoundTrip: every queue key keyspace builds parses back to
// what built it, ids with '-' and ':' included, and others are refused.
func TestQueueKeysRoundTrip(t *testing.T) {
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
