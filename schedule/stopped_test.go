package schedule_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	dueidx "github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/schedule"
)

// TestTimingThatNoLongerReadsStopsWithARecord: a stored spec whose timing
// no longer reads stops its fires with a log line and a STOPPED history
// record; an update that fixes it fires again.
func TestTimingThatNoLongerReadsStopsWithARecord(t *testing.T) {
	c, cli, ns := newClient(t)
	ctx := context.Background()
	if _, err := c.Create(ctx, schedule.Schedule{Name: "z", Cron: "* * * * *", Queue: "q", Type: "t", Paused: true}); err != nil {
		t.Fatal(err)
	}
	ks, _ := keyspace.New(ns)
	key := ks.Schedule("z")
	g, err := cli.Get(ctx, key)
	if err != nil || len(g.Kvs) != 1 {
		t.Fatal(err)
	}
	var rec map[string]any
	_ = json.Unmarshal(g.Kvs[0].Value, &rec)
	spec := rec["spec"].(map[string]any)
	spec["tz"], spec["paused"] = "Gone/Zone", false
	at := time.Now().Add(-time.Second)
	rec["due"] = dueidx.Key(ks.ScheduleDue(), at, "z")
	rec["nominal"] = at.UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(rec)
	if _, err := cli.Put(ctx, key, string(b)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, rec["due"].(string), at.UTC().Format(time.RFC3339Nano)); err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	r := &schedule.Runner{Client: c, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	r.Start(ctx)
	defer r.Stop()
	fires := waitHistory(t, c, "z", 1)
	if !strings.HasPrefix(fires[0].Outcome, "STOPPED: ") || !strings.Contains(fires[0].Outcome, "tz") {
		t.Fatalf("history of a schedule whose timing no longer reads: %+v", fires)
	}
	if !etcdtest.Eventually(10*time.Second, func() bool { return strings.Contains(logs.String(), "fires stop") }) {
		t.Fatalf("no log line: %s", logs.String())
	}
	s, err := c.Update(ctx, "z", func(s *schedule.Schedule) { s.TZ = "UTC" })
	if err != nil || s.NextFireAt.IsZero() {
		t.Fatalf("update that fixes it: %+v %v", s, err)
	}
}
