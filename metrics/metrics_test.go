package metrics

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve runs Serve on a loopback port and returns its URL, the function
// that ends it, and a function that waits for Serve's result.
func serve(t *testing.T) (string, context.CancelFunc, func() error) {
	t.Helper()
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var err2 error
	done := make(chan struct{})
	go func() { defer close(done); err2 = Serve(ctx, l, slog.New(slog.DiscardHandler)) }()
	wait := func() error { <-done; return err2 }
	t.Cleanup(func() { cancel(); _ = wait() })
	return "http://" + l.Addr().String(), cancel, wait
}

func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func TestServeMetrics(t *testing.T) {
	url, _, _ := serve(t)
	code, body, err := get(url + "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	if !strings.Contains(body, "go_goroutines") {
		t.Fatalf("GET /metrics has no Go collector metrics:\n%.300s", body)
	}
}

// Serve returns only when nothing of its server runs: a CPU profile in
// flight when ctx ends is given its grace, then its connection is closed,
// before Serve returns (it used to return at once and leave the profile
// running for its seconds).
func TestServeWaitsForRequestsInFlight(t *testing.T) {
	url, cancel, wait := serve(t)
	long := make(chan error, 1)
	go func() {
		_, _, err := get(url + "/debug/pprof/profile?seconds=120")
		long <- err
	}()
	// The profile runs once its handler shows in the goroutine dump.
	running := false
	for range 500 {
		_, dump, err := get(url + "/debug/pprof/goroutine?debug=2")
		if err == nil && strings.Contains(dump, "net/http/pprof.Profile(") {
			running = true
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !running {
		t.Fatal("the long profile never started")
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	// Serve has returned: the long request's connection is closed, so its
	// client has its answer (an error) promptly, not after 120 s.
	select {
	case <-long:
	case <-time.After(30 * time.Second):
		t.Fatal("the profile request still runs after Serve returned")
	}
	if c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://")); err == nil {
		c.Close()
		t.Fatal("the listener still accepts after Serve returned")
	}
}
