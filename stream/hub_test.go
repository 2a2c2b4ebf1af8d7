package stream_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/stream"
)

// watchers reads how many watches the etcd server serves, from its
// etcd_debugging_mvcc_watcher_total gauge.
func watchers(t *testing.T) int {
	t.Helper()
	resp, err := http.Get(srv.ClientURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watcher_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}
	}
	t.Fatal("etcd publishes no etcd_debugging_mvcc_watcher_total")
	return 0
}

// Not parallel: it counts the server's watches.
func TestThousandFollowersShareOneWatch(t *testing.T) {
	e := newEnv(t, stream.Limits{})
	ctx := context.Background()
	const id, followers, events = "task-many", 1000, 20
	before := watchers(t)
	a := stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}
	var got sync.WaitGroup
	got.Add(followers)
	counts := make([]int, followers)
	var ended sync.WaitGroup
	for i := range followers {
		ended.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			next := int64(1)
			for ev, err := range e.hub.Follow(fctx, id, 0) {
				if err != nil {
					t.Errorf("follower %d: %v", i, err)
					return
				}
				if ev.Seq != next {
					t.Errorf("follower %d: seq %d, want %d", i, ev.Seq, next)
				}
				next++
				if counts[i]++; counts[i] == 2 {
					got.Done() // attempt_started and the first event: it follows
				}
			}
		})
	}
	if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	got.Wait()
	if n := e.hub.Watching(); n != 1 {
		t.Fatalf("the hub has %d watches open for %d followers of one stream", n, followers)
	}
	if d := watchers(t) - before; d != 1 {
		t.Fatalf("etcd serves %d more watches for %d followers of one stream, want 1", d, followers)
	}
	for i := 1; i < events; i++ {
		if _, _, err := e.w.Append(ctx, a, []stream.Input{{Type: "log"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.w.End(ctx, a, stream.Done, "succeeded", nil); err != nil {
		t.Fatal(err)
	}
	ended.Wait()
	for i, n := range counts {
		if n != events+2 {
			t.Fatalf("follower %d saw %d events, want %d", i, n, events+2)
		}
	}
	if n := e.hub.Watching(); n != 0 || e.hub.Opened() != 1 {
		t.Fatalf("after the last follower: %d watches open, %d opened", n, e.hub.Opened())
	}
}

// TestSlowFollowerThatLeavesClosesTheWatch: a follower let go for
// falling behind, which then leaves, leaves no watch open.
func TestSlowFollowerThatLeavesClosesTheWatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "slow"
	c := stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}
	if _, _, err := e.w.Append(ctx, c, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	const chunks = 300 // past the follower's buffer
	at, release := make(chan struct{}), make(chan struct{})
	var done sync.WaitGroup
	done.Go(func() { // the follower: takes one event, then waits
		for range e.hub.Follow(ctx, id, 1) {
			close(at)
			<-release
			return
		}
	})
	<-at
	for range chunks {
		if _, _, err := e.w.Append(ctx, c, []stream.Input{{Type: "log"}}); err != nil {
			t.Fatal(err)
		}
	}
	for stream.Followers(e.hub, id) != 0 { // until it is let go
		if ctx.Err() != nil {
			t.Fatal("the slow follower was never let go")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	done.Wait()
	if n := e.hub.Watching(); n != 0 {
		t.Fatalf("%d watches open after every follower left, want 0", n)
	}
}
