package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/httpapi"
)

// TestCleanupAfterStallEnds: when etcd stops answering right after a
// request was granted a lease, the request still answers 503 soon after
// its bound: revoking the lease it will not use is bounded too (the lease
// then ends with its TTL).
func TestCleanupAfterStallEnds(t *testing.T) {
	t.Parallel()
	p := newStallProxy(t, srv.Endpoints()[0])
	cli, err := cluster.Connect(context.Background(), cluster.ClientConfig{Endpoints: []string{p.addr()}, DialTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	a := newAPI(t, func(c *httpapi.Config) {
		c.Etcd = cli
		c.RequestTimeout = 500 * time.Millisecond
	})
	defer httpapi.SetAfterGrant(func(ctx context.Context) {
		if httpapi.NamespaceOf(ctx) == a.ns {
			p.stall()
		}
	})()
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/sessions", `{"ttl": 10}`},
		{"POST", "/v1/locks/stalled", `{"owner": "w1", "ttl": 5}`},
		{"POST", "/locks/stalled2", `{"owner": "w1", "ttl": 5}`},
	} {
		p.resume()
		req, err := http.NewRequest(c.method, a.base+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(httpapi.NamespaceHeader, a.ns)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		r, raw := answerWithin(t, req, time.Minute)
		if r.StatusCode != http.StatusServiceUnavailable && r.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("%s %s: %d %s; want 503", c.method, c.path, r.StatusCode, raw)
		}
		t.Logf("%s %s: %d after %s: %s", c.method, c.path, r.StatusCode, time.Since(start), raw)
	}
	p.resume()
}
