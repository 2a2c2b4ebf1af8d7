package schedule_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestCorruptRecordSparesTheOthers: a record that does not read drops its
// own due item with one log line; the other schedules of the namespace go
// on firing, and Delete still removes it.
func TestCorruptRecordSparesTheOthers(t *testing.T) {
	c, cli, ns := newClient(t)
	ctx := context.Background()
	for _, n := range []string{"a", "b"} {
		if _, err := c.Create(ctx, schedule.Schedule{Name: n, Every: queue.Duration(time.Second), Queue: "q", Type: "t", Overlap: schedule.Allow}); err != nil {
			t.Fatal(err)
		}
	}
	ks, _ := keyspace.New(ns)
	if _, err := cli.Put(ctx, ks.Schedule("a"), "{not json"); err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	r := &schedule.Runner{Client: c, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	r.Start(ctx)
	defer r.Stop()
	if !etcdtest.Eventually(20*time.Second, func() bool {
		f, err := c.History(ctx, "b", 0)
		return err == nil && len(f) >= 3
	}) {
		f, _ := c.History(ctx, "b", 0)
		t.Fatalf("schedule b fired %d times in 20s next to a corrupt record a: %s", len(f), logs.String())
	}
	if n := strings.Count(logs.String(), "its fires stop"); n != 1 {
		t.Fatalf("corrupt record logged %d times, want 1:\n%s", n, logs.String())
	}
	if err := c.Delete(ctx, "a"); err != nil {
		t.Fatalf("delete a corrupt record: %v", err)
	}
	if g, _ := cli.Get(ctx, ks.Schedule("a")); len(g.Kvs) != 0 {
		t.Fatal("corrupt record stays after delete")
	}
}
