package httpapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestAlarmReaderKeepsItsReading: /readyz's reading of etcd's alarms is
// kept for alarmTTL on its clock, so that probes do not each ask etcd: a
// NOSPACE alarm raised just after a reading shows once the clock has moved
// alarmTTL on, not before; the reason names the alarm.
func TestAlarmReaderKeepsItsReading(t *testing.T) {
	t.Parallel()
	_, cli := etcdtest.QuotaServer(t, 16<<20)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := &alarmReader{cli: cli, now: func() time.Time { return now }}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if got := r.noSpace(ctx); got != "" {
		t.Fatalf("an empty store: %q", got)
	}
	big := strings.Repeat("x", 1<<20)
	var err error
	for i := 0; i < 40 && err == nil; i++ { // 40 MiB at most: past the 16 MiB quota
		_, err = cli.Put(ctx, fmt.Sprintf("/filler/%03d", i), big)
	}
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("filling a 16 MiB store: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	now = now.Add(alarmTTL - time.Millisecond)
	if got := r.noSpace(ctx); got != "" {
		t.Fatalf("within alarmTTL of the last reading: %q, want it kept", got)
	}
	now = now.Add(time.Millisecond)
	if got := r.noSpace(ctx); !strings.Contains(got, "NOSPACE alarm is raised") || !strings.Contains(got, "drover tasks purge") {
		t.Fatalf("alarmTTL after the last reading: %q, want the alarm", got)
	}
}
