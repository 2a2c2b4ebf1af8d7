package client

import (
	"testing"
	"time"
)

func newTestClient(t *testing.T, endpoints ...string) *Client {
	t.Helper()
	c, err := New(Config{Endpoints: endpoints})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(t.Context()) })
	return c
}

// TestParseEndpoint checks the endpoint forms a client takes.
func TestParseEndpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:7100", "http://127.0.0.1:7100"},
		{" lock-service-0.lock-service-headless:3000 ", "http://lock-service-0.lock-service-headless:3000"},
		{"https://h:443/", "https://h:443"},
		{"[::1]:7100", "http://[::1]:7100"},
		{"127.0.0.1", ""}, {"ftp://h:1", ""}, {"h:99999", ""}, {"http://h:1/path", ""}, {"", ""},
	} {
		got, err := ParseEndpoint(tc.in)
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("a client without endpoints")
	}
}

// TestClientLeaderThatFailedIsNotFollowed checks that an answer naming as
// the leader an endpoint that failed the client lately does not send the
// next request back there: the nodes may still name a leader this client
// cannot reach.
func TestClientLeaderThatFailedIsNotFollowed(t *testing.T) {
	t.Parallel()
	c := newTestClient(t, "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
	if got := c.leaderOr("127.0.0.1:3", 1); got != 2 {
		t.Fatalf("leader at the third endpoint: next %d, want 2", got)
	}
	if got := c.leaderOr("127.0.0.1:9", 1); got != 1 {
		t.Fatalf("a leader that is not an endpoint: next %d, want 1 (the one that answered)", got)
	}
	c.failed[2].Store(time.Now().UnixNano())
	if got := c.leaderOr("127.0.0.1:3", 1); got != 1 {
		t.Fatalf("a leader that just failed: next %d, want 1 (the one that answered)", got)
	}
	c.failed[2].Store(time.Now().Add(-leaderRetry).UnixNano())
	if got := c.leaderOr("127.0.0.1:3", 1); got != 2 {
		t.Fatalf("a leader that failed %v ago: next %d, want 2", leaderRetry, got)
	}
}
