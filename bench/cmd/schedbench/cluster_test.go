package main

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestClusterLeaderKill starts the 3-member cluster the drover run uses,
// SIGKILLs its etcd leader twice and starts it again: each time another
// member leads, and the killed one serves again. It needs DROVER_BIN.
func TestClusterLeaderKill(t *testing.T) {
	bin := os.Getenv("DROVER_BIN")
	if bin == "" {
		t.Skip("DROVER_BIN is not set")
	}
	t.Cleanup(killAll)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := config{droverBin: bin, workDir: t.TempDir()}
	ms, err := startCluster(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		l, err := leaderOf(ctx, ms)
		if err != nil {
			t.Fatal(err)
		}
		l.kill()
		next, err := leaderOf(ctx, ms)
		if err != nil {
			t.Fatal(err)
		}
		if next == l {
			t.Fatalf("kill %d: %s still leads after its SIGKILL", i+1, l.name)
		}
		if err := l.start(); err != nil {
			t.Fatal(err)
		}
		if err := l.waitReady(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("kill %d: %s killed, %s leads, %s serves again", i+1, l.name, next.name, l.name)
	}
}

func TestSummarize(t *testing.T) {
	start := time.Unix(1000, 0)
	c := config{duration: 5 * time.Second, every: time.Second}
	at := func(s, ms int) fire {
		n := start.Add(time.Duration(s) * time.Second)
		return fire{nominal: n, at: n.Add(time.Duration(ms) * time.Millisecond)}
	}
	// Ticks 0, 1 (twice), 4; 2 and 3 missed; one fire before the window.
	r := summarize("x", c, start, []fire{at(0, 5), at(1, 7), at(1, 9), at(4, 20), at(-1, 1)}, nil)
	if r.Expected != 5 || r.Fired != 4 || r.Distinct != 3 || r.Duplicates != 1 || r.Missed != 2 || r.LongestGapS != 2 || r.OutsideWindow != 1 {
		t.Fatalf("summary %+v", r)
	}
	if r.LateP50ms != 7 || r.LateMaxms != 20 {
		t.Fatalf("lateness p50 %v max %v, want 7 and 20", r.LateP50ms, r.LateMaxms)
	}
}
