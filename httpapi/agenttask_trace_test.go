package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/droverhq/drover/httpapi"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TestAgentTaskClaimKeepsItsTraceparent: the first claim of an agent
// task that gives a traceparent stores it with the task, and every
// claim after it answers that one (a later one does not replace it), so
// that each claim's attempt span continues one trace; a malformed one is
// a 400 naming the field, and nothing is stored.
func TestAgentTaskClaimKeepsItsTraceparent(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	const first = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const later = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	s := a.session(30)
	keys := a.keyCount()
	r := a.do("POST", "/v1/agent-tasks/tr-1/claim", map[string]any{"session": s, "steps": 2, "traceparent": "00-zz"}).problem(t, 400)
	if !strings.Contains(string(r.Raw), "body.traceparent") {
		t.Fatalf("the problem does not name body.traceparent: %s", r.Raw)
	}
	if n := a.keyCount(); n != keys {
		t.Fatalf("a refused claim changed the keys: %d, then %d", keys, n)
	}
	if c := a.do("POST", "/v1/agent-tasks/tr-0/claim", map[string]any{"session": s, "steps": 2}).want(t, 200); c.JSON["traceparent"] != nil {
		t.Fatalf("a claim that gave none, on a server that does not trace: %s", c.Raw)
	}
	c := a.do("POST", "/v1/agent-tasks/tr-1/claim", map[string]any{"session": s, "steps": 2, "traceparent": first}).want(t, 200)
	if c.JSON["traceparent"] != first {
		t.Fatalf("first claim: %s, want traceparent %s", c.Raw, first)
	}
	a.step("tr-1", 1, s, c.num("token"), "one").want(t, 200)
	a.do("DELETE", "/v1/agent-tasks/tr-1/claim?session="+s+"&token="+fmt.Sprint(int64(c.num("token"))), nil).want(t, 204)
	for _, body := range []map[string]any{{"session": s, "traceparent": later}, {"session": s}} {
		c = a.do("POST", "/v1/agent-tasks/tr-1/claim", body).want(t, 200)
		if c.JSON["traceparent"] != first || c.num("next_step") != 2 {
			t.Fatalf("claim again with %v: %s, want the first traceparent %s", body, c.Raw, first)
		}
		a.do("DELETE", "/v1/agent-tasks/tr-1/claim?session="+s+"&token="+fmt.Sprint(int64(c.num("token"))), nil).want(t, 204)
	}
}

// TestTracedServerKeepsTheFirstClaimsContext: on a server that traces,
// a claim that gives no traceparent stores its request's context (the
// route's span, under the caller's traceparent header).
func TestTracedServerKeepsTheFirstClaimsContext(t *testing.T) {
	t.Parallel()
	a := newAPI(t, func(c *httpapi.Config) { c.TracerProvider = sdktrace.NewTracerProvider() })
	const header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	c := a.do("POST", "/v1/agent-tasks/tr-2/claim", map[string]any{"session": a.session(30)}, "traceparent: "+header).want(t, 200)
	if tp, _ := c.JSON["traceparent"].(string); !strings.HasPrefix(tp, header[:36]) || len(tp) != len(header) || tp == header {
		t.Fatalf("claim: traceparent %q, want the server's span in the header's trace %s", tp, header[:35])
	}
}
