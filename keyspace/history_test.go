package keyspace_test

import (
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
)

func TestQueueHistoryKeysRoundTrip(t *testing.T) {
	s := keyspace.MustNew("ns")
	m := time.Date(2026, 11, 28, 12, 34, 0, 0, time.UTC)
	k := s.QueueHistoryMinute("emails.v2", m)
	if k != "/ns/queue-history/q/emails.v2/001795869240" {
		t.Errorf("key %q", k)
	}
	q, got, ok := s.ParseQueueHistoryMinute(k)
	if !ok || q != "emails.v2" || !got.Equal(m) {
		t.Errorf("parsed %q %v %v", q, got, ok)
	}
	for _, bad := range []string{s.QueueHistoryMark(), s.QueueHistoryMinutes("q") + "12", "/other/queue-history/q/q/001795869240"} {
		if _, _, ok := s.ParseQueueHistoryMinute(bad); ok {
			t.Errorf("%q parsed as a minute", bad)
		}
	}
	for _, c := range []struct {
		key, q, kind, rest string
		ok                 bool
	}{
		{s.Out("emails", "seg", "x"), "emails", "outs", "seg/x", true},
		{s.QueueRetry("emails") + "1-a", "emails", "retry", "1-a", true},
		{s.DeadTask("emails", "id"), "emails", "dead", "id", true},
		{s.QueueName("emails"), "", "", "", false},
		{s.Queue("emails"), "emails", "", "", false},
	} {
		q, kind, rest, ok := s.ParseQueueKey(c.key)
		if q != c.q || kind != c.kind || rest != c.rest || ok != c.ok {
			t.Errorf("%s: %q %q %q %v", c.key, q, kind, rest, ok)
		}
	}
	if !(s.QueueHistory() < s.QueueName("a") && s.QueueName("a") < s.Queue("a") && s.Queue("zz")+"x" < s.QueueWatchEnd()) {
		t.Error("the watch range does not hold the history and the queues")
	}
}
