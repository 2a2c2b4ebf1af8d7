package qstats

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A server whose clock runs ahead closes minutes early: the others say
// so when its mark reaches them; within the tolerance, nothing is said.
func TestClockAheadIsReported(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ahead time.Duration
		warn  bool
	}{{"ahead", 40 * time.Second, true}, {"within", skewTolerance / 2, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			end := t0.Add(time.Minute + closeDelay)
			a := startWith(t, Config{Client: srv.Client(t), Namespace: ns, Manual: true, Now: func() time.Time { return end.Add(tc.ahead) }})
			var log syncBuffer
			b := startWith(t, Config{Client: srv.Client(t), Namespace: ns, Manual: true, Now: func() time.Time { return end },
				Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if ok, err := a.CloseMinute(context.Background(), t0); !ok || err != nil {
				t.Fatalf("close: %v %v", ok, err)
			}
			if !etcdtest.Eventually(30*time.Second, func() bool {
				b.mu.Lock()
				defer b.mu.Unlock()
				return b.mk.Minute == t0.Unix()
			}) {
				t.Fatal("the mark did not reach the other server")
			}
			if got := strings.Contains(log.String(), "clock ahead"); got != tc.warn {
				t.Errorf("%v ahead: warned %v, want %v: %q", tc.ahead, got, tc.warn, log.String())
			}
		})
	}
}
