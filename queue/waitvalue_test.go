package queue

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A wait key's value gives back the pending key and the attempts it was
// written with, in its short form (far shorter than a retry key's JSON)
// and in the JSON that binaries before it wrote; a value of neither form
// is unreadable.
func TestWaitValueRoundTrip(t *testing.T) {
	c := &Client{keys: keyspace.MustNew("ns")}
	for _, id := range []string{"wf-1", "a-b-1", "p.1.0", "x"} {
		pk := c.keys.PendingKey("q", keyspace.Pending{Shard: 7, Level: 3, Submitted: time.Unix(0, 1795904139512451874), ID: id})
		key := []byte(due.Key(c.keys.QueueWait("q"), time.Unix(100, 0), id))
		short := c.waitValue("q", id, pk, 2)
		legacy, _ := json.Marshal(retryValue{PendingKey: pk, Attempts: 2})
		if len(short) > 30 || len(short) >= len(legacy)/2 {
			t.Errorf("%s: value %q is %d bytes (the JSON: %d)", id, short, len(short), len(legacy))
		}
		for _, v := range []string{short, string(legacy)} {
			got, attempts, ok := c.waitPending("q", &mvccpb.KeyValue{Key: key, Value: []byte(v)})
			if !ok || got != pk || attempts != 2 {
				t.Errorf("%s: %q read as %q, %d, %v; want %q, 2", id, v, got, attempts, ok, pk)
			}
		}
	}
	key := []byte(due.Key(c.keys.QueueWait("q"), time.Unix(100, 0), "x"))
	for _, v := range []string{"", "x", "2", "two 007/3", `{"a":1}`} {
		if pk, _, ok := c.waitPending("q", &mvccpb.KeyValue{Key: key, Value: []byte(v)}); ok {
			t.Errorf("value %q read as %q; want unreadable", v, pk)
		}
	}
}
