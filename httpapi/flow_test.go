package httpapi_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
)

// badCase is one bad request: its body (nil: none) and path, and the status
// it must get (400 unless said).
type badCase struct {
	what   string
	method string
	path   string
	body   any
	status int
}

// badBodies are the classes of bad bodies every route with a body must
// refuse: good is a valid body, as a JSON object's fields.
func badBodies(method, path, good string) []badCase {
	trimmed := strings.TrimSuffix(good, "}")
	return []badCase{
		{"malformed JSON", method, path, trimmed, 400},
		{"not an object", method, path, "[1,2]", 400},
		{"unknown field", method, path, trimmed + `,"surprise":1}`, 400},
		{"oversize", method, path, trimmed + `,"pad":"` + strings.Repeat("x", 1<<20+10) + `"}`, 413},
	}
}

// checkBad sends every case and checks it gets its problem and changes no
// key of the namespace.
func checkBad(t *testing.T, a *api, cases []badCase) {
	t.Helper()
	for _, c := range cases {
		before := a.keyCount()
		code := c.status
		if code == 0 {
			code = 400
		}
		r := a.do(c.method, c.path, c.body)
		if r.Status != code || r.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s (%s): %d %s, want a %d problem", c.method, c.path, c.what, r.Status, trunc(r.Raw), code)
			continue
		}
		if after := a.keyCount(); after != before {
			t.Errorf("%s %s (%s): keys %d → %d: a refused request wrote", c.method, c.path, c.what, before, after)
		}
	}
}

func trunc(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// TestLimitTakeSettle: a limit is set, read and listed; a take spends its
// tokens; a take beyond what the bucket holds within a short wait gets 429
// with Retry-After and takes nothing; settling gives back the unused
// tokens; a take larger than the burst is a 400; a deleted limit is 404.
func TestLimitTakeSettle(t *testing.T) {
	a := newAPI(t)
	r := a.do("PUT", "/v1/limits/llm", map[string]any{"rate": "1/m", "burst": 3}).want(t, 200)
	if r.str("rate") != "1/m" || r.num("burst") != 3 || r.num("available") != 3 {
		t.Fatalf("set: %s", r.Raw)
	}
	r = a.do("POST", "/v1/limits/llm/take", map[string]any{"n": 2}).want(t, 200)
	if r.num("taken") != 2 || r.num("used") != 2 || r.num("available") > 1.01 {
		t.Fatalf("take: %s", r.Raw)
	}
	start := time.Now()
	r = a.do("POST", "/v1/limits/llm/take", map[string]any{"n": 2, "wait": "300ms"}).problem(t, 429)
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 50 || s > 60 {
		t.Fatalf("Retry-After %q, want about 60 s (one token a minute)", r.Header.Get("Retry-After"))
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("a take that cannot be granted within its wait took %s", time.Since(start))
	}
	r = a.do("GET", "/v1/limits/llm", nil).want(t, 200)
	if r.num("used") != 2 || r.num("available") > 1.01 {
		t.Fatalf("the refused take took tokens: %s", r.Raw)
	}
	r = a.do("POST", "/v1/limits/llm/settle", map[string]any{"reserved": 2, "used": 1}).want(t, 200)
	if r.num("used") != 1 || r.num("available") < 1.99 {
		t.Fatalf("settle: %s", r.Raw)
	}
	r = a.do("POST", "/v1/limits/llm/settle", map[string]any{"reserved": 1, "used": 3}).want(t, 200)
	if r.num("used") != 3 || r.num("available") > 0.01 {
		t.Fatalf("settle over the reservation: %s", r.Raw)
	}
	a.do("POST", "/v1/limits/llm/take", map[string]any{"n": 4}).problem(t, 400)
	r = a.do("GET", "/v1/limits", nil).want(t, 200)
	if len(r.List) != 1 || r.List[0].(map[string]any)["name"] != "llm" {
		t.Fatalf("list: %s", r.Raw)
	}
	a.do("DELETE", "/v1/limits/llm", nil).want(t, 204)
	a.do("DELETE", "/v1/limits/llm", nil).problem(t, 404)
	a.do("GET", "/v1/limits/llm", nil).problem(t, 404)
	a.do("POST", "/v1/limits/llm/take", map[string]any{"n": 1}).problem(t, 404)
	a.do("POST", "/v1/limits/llm/settle", map[string]any{"reserved": 1, "used": 1}).problem(t, 404)
}

// TestLimitTakeWaits: a take with a wait longer than the refill gets its
// tokens once they come, not before.
func TestLimitTakeWaits(t *testing.T) {
	a := newAPI(t)
	a.do("PUT", "/v1/limits/api", map[string]any{"rate": "5/s", "burst": 1}).want(t, 200)
	a.do("POST", "/v1/limits/api/take", map[string]any{"n": 1}).want(t, 200)
	start := time.Now()
	a.do("POST", "/v1/limits/api/take", map[string]any{"n": 1, "wait": "3s"}).want(t, 200)
	if d := time.Since(start); d < 100*time.Millisecond || d > 2*time.Second {
		t.Fatalf("the waiting take was granted after %s; the bucket refills one token in 200 ms", d)
	}
}

// TestLimitBadInput: every bad input to the limit routes is a 400 problem
// (413 for an oversize body) and writes nothing.
func TestLimitBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("PUT", "/v1/limits/llm", map[string]any{"rate": "10/s"}).want(t, 200)
	long := strings.Repeat("n", 129)
	cases := []badCase{
		{"n 0", "POST", "/v1/limits/llm/take", map[string]any{"n": 0}, 0},
		{"n negative", "POST", "/v1/limits/llm/take", map[string]any{"n": -3}, 0},
		{"n missing", "POST", "/v1/limits/llm/take", map[string]any{"wait": "1s"}, 0},
		{"n a string", "POST", "/v1/limits/llm/take", `{"n":"two"}`, 0},
		{"n a fraction", "POST", "/v1/limits/llm/take", `{"n":1.5}`, 0},
		{"n over the burst", "POST", "/v1/limits/llm/take", map[string]any{"n": 11}, 0},
		{"bad wait", "POST", "/v1/limits/llm/take", map[string]any{"n": 1, "wait": "soon"}, 0},
		{"invalid name", "POST", "/v1/limits/" + long + "/take", map[string]any{"n": 1}, 0},
		{"invalid name chars", "POST", "/v1/limits/a%20b/take", map[string]any{"n": 1}, 0},
		{"reserved 0", "POST", "/v1/limits/llm/settle", map[string]any{"reserved": 0, "used": 0}, 0},
		{"used negative", "POST", "/v1/limits/llm/settle", map[string]any{"reserved": 1, "used": -1}, 0},
		{"used a string", "POST", "/v1/limits/llm/settle", `{"reserved":1,"used":"1"}`, 0},
		{"bad rate", "PUT", "/v1/limits/llm", map[string]any{"rate": "fast"}, 0},
		{"rate 0", "PUT", "/v1/limits/llm", map[string]any{"rate": "0/s"}, 0},
		{"burst negative", "PUT", "/v1/limits/llm", map[string]any{"rate": "1/s", "burst": -1}, 0},
		{"rate a number", "PUT", "/v1/limits/llm", `{"rate":5}`, 0},
		{"invalid name (set)", "PUT", "/v1/limits/" + long, map[string]any{"rate": "1/s"}, 0},
		{"invalid name (get)", "GET", "/v1/limits/a%21b", nil, 0},
	}
	cases = append(cases, badBodies("POST", "/v1/limits/llm/take", `{"n":1}`)...)
	cases = append(cases, badBodies("POST", "/v1/limits/llm/settle", `{"reserved":1,"used":1}`)...)
	cases = append(cases, badBodies("PUT", "/v1/limits/llm", `{"rate":"5/s"}`)...)
	checkBad(t, a, cases)
	if r := a.do("GET", "/v1/limits/llm", nil).want(t, 200); r.num("used") != 0 || r.str("rate") != "10/s" {
		t.Fatalf("bad requests changed the limit: %s", r.Raw)
	}
}

// TestQuotaSlots: slots are acquired under sessions up to the limit (429
// with Retry-After beyond it), released, counted per tenant for the tenant
// quota, and listed; releasing a slot not held is a 409.
func TestQuotaSlots(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	r := a.do("PUT", "/v1/quotas/db", map[string]any{"limit": 2}).want(t, 200)
	if r.num("limit") != 2 {
		t.Fatalf("set: %s", r.Raw)
	}
	s1, s2 := a.session(30), a.session(30)
	acquire := func(sess string, extra ...any) resp {
		body := map[string]any{"session": sess}
		for i := 0; i+1 < len(extra); i += 2 {
			body[extra[i].(string)] = extra[i+1]
		}
		return a.do("POST", "/v1/quotas/db/acquire", body)
	}
	acquire(s1).want(t, 200)
	if r := acquire(s1).want(t, 200); r.num("held") != 2 || r.num("in_use") != 2 || r.str("subject") != "-" {
		t.Fatalf("second acquire: %s", r.Raw)
	}
	r = acquire(s2, "wait", "200ms").problem(t, 429)
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	r = a.do("POST", "/v1/quotas/db/release", map[string]any{"session": s1}).want(t, 200)
	if r.num("held") != 1 || r.num("in_use") != 1 {
		t.Fatalf("release: %s", r.Raw)
	}
	acquire(s2).want(t, 200)
	r = a.do("GET", "/v1/quotas/db", nil).want(t, 200)
	if held := r.JSON["held"].(map[string]any); held["-"] != 2.0 {
		t.Fatalf("get: %s", r.Raw)
	}
	a.do("POST", "/v1/quotas/db/release", map[string]any{"session": s2}).want(t, 200)
	a.do("POST", "/v1/quotas/db/release", map[string]any{"session": s2}).problem(t, 409)

	// Per tenant: each tenant has its own slots.
	a.do("PUT", "/v1/quotas/tenant", map[string]any{"limit": 1}).want(t, 200)
	a.do("PUT", "/v1/quotas/tenant", map[string]any{"limit": 2, "subject": "globex"}).want(t, 200)
	tenant := func(sess, sub string) resp {
		return a.do("POST", "/v1/quotas/tenant/acquire", map[string]any{"session": sess, "subject": sub})
	}
	tenant(s1, "acme").want(t, 200)
	tenant(s2, "acme").problem(t, 429)
	tenant(s2, "globex").want(t, 200)
	tenant(s2, "globex").want(t, 200)
	tenant(s1, "globex").problem(t, 429)
	r = a.do("GET", "/v1/quotas", nil).want(t, 200)
	if len(r.List) != 2 {
		t.Fatalf("list: %s", r.Raw)
	}
	a.do("DELETE", "/v1/quotas/tenant", nil).want(t, 204)
	a.do("GET", "/v1/quotas/tenant", nil).problem(t, 404)
	a.do("POST", "/v1/quotas/nope/acquire", map[string]any{"session": s1}).problem(t, 404)
}

// TestQuotaSlotFreedWithSession: a slot held under a session that is no
// longer kept alive is free again within its TTL + 1 s, and a waiting
// acquire gets it.
func TestQuotaSlotFreedWithSession(t *testing.T) {
	a := newAPI(t)
	a.do("PUT", "/v1/quotas/gpu", map[string]any{"limit": 1}).want(t, 200)
	created := time.Now()
	dying := a.session(2)
	a.do("POST", "/v1/quotas/gpu/acquire", map[string]any{"session": dying}).want(t, 200)
	other := a.session(30)
	r := a.do("POST", "/v1/quotas/gpu/acquire", map[string]any{"session": other, "wait": "6s"}).want(t, 200)
	if d := time.Since(created); d > 3*time.Second {
		t.Fatalf("the slot was freed %s after the session's last keepalive; its TTL is 2 s", d)
	}
	if r.num("in_use") != 1 {
		t.Fatalf("acquired: %s", r.Raw)
	}
}

// TestQuotaBadInput: bad input to the quota routes is a 400 problem and
// writes nothing.
func TestQuotaBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("PUT", "/v1/quotas/db", map[string]any{"limit": 1}).want(t, 200)
	a.do("PUT", "/v1/quotas/tenant", map[string]any{"limit": 1}).want(t, 200)
	sess := a.session(30)
	cases := []badCase{
		{"limit 0", "PUT", "/v1/quotas/db", map[string]any{"limit": 0}, 0},
		{"limit too high", "PUT", "/v1/quotas/db", map[string]any{"limit": 100001}, 0},
		{"limit a string", "PUT", "/v1/quotas/db", `{"limit":"3"}`, 0},
		{"subject with a slash", "PUT", "/v1/quotas/tenant", map[string]any{"limit": 2, "subject": "a/b"}, 0},
		{"invalid name", "PUT", "/v1/quotas/a%2Fb", map[string]any{"limit": 2}, 0},
		{"no session", "POST", "/v1/quotas/db/acquire", map[string]any{}, 0},
		{"bad session", "POST", "/v1/quotas/db/acquire", map[string]any{"session": "zz"}, 0},
		{"session a number", "POST", "/v1/quotas/db/acquire", `{"session":5}`, 0},
		{"subject on a resource", "POST", "/v1/quotas/db/acquire", map[string]any{"session": sess, "subject": "acme"}, 0},
		{"tenant without subject", "POST", "/v1/quotas/tenant/acquire", map[string]any{"session": sess}, 0},
		{"bad wait", "POST", "/v1/quotas/db/acquire", map[string]any{"session": sess, "wait": "-1s"}, 0},
		{"wait on release", "POST", "/v1/quotas/db/release", map[string]any{"session": sess, "wait": "1s"}, 0},
		{"invalid name (acquire)", "POST", "/v1/quotas/" + strings.Repeat("q", 129) + "/acquire", map[string]any{"session": sess}, 0},
	}
	cases = append(cases, badBodies("PUT", "/v1/quotas/db", `{"limit":3}`)...)
	cases = append(cases, badBodies("POST", "/v1/quotas/db/acquire", `{"session":"`+sess+`"}`)...)
	cases = append(cases, badBodies("POST", "/v1/quotas/db/release", `{"session":"`+sess+`"}`)...)
	checkBad(t, a, cases)
	// A session that ended is a 404, not a slot.
	gone := a.session(30)
	a.do("DELETE", "/v1/sessions/"+gone, nil).want(t, 204)
	before := a.keyCount()
	a.do("POST", "/v1/quotas/db/acquire", map[string]any{"session": gone}).problem(t, 404)
	if a.keyCount() != before {
		t.Fatal("an acquire under an ended session wrote")
	}
}

// TestBreakerRoutes: a breaker set over the API opens after its failures
// (allow then answers 503 with Retry-After), lets one probe through after
// its cooldown, closes on the probe's success, and is reset and deleted.
func TestBreakerRoutes(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	r := a.do("PUT", "/v1/breakers/crm", map[string]any{"failures": 2, "cooldown": "1s"}).want(t, 200)
	if cfg := r.JSON["config"].(map[string]any); cfg["failures"] != 2.0 || cfg["cooldown"] != "1s" || r.str("state") != "closed" {
		t.Fatalf("set: %s", r.Raw)
	}
	r = a.do("POST", "/v1/breakers/crm/allow", map[string]any{}).want(t, 200)
	if r.JSON["allowed"] != true || r.str("call") == "" || r.JSON["probe"] != false {
		t.Fatalf("allow: %s", r.Raw)
	}
	a.do("POST", "/v1/breakers/crm/outcome", map[string]any{"ok": false}).want(t, 200)
	r = a.do("POST", "/v1/breakers/crm/outcome", map[string]any{"ok": false}).want(t, 200)
	if r.str("state") != "open" || r.num("opened") != 1 {
		t.Fatalf("after 2 failures: %s", r.Raw)
	}
	r = a.do("POST", "/v1/breakers/crm/allow", map[string]any{"call": "c1"}).problem(t, 503)
	if ra := r.Header.Get("Retry-After"); (ra != "1" && ra != "2") || !strings.Contains(r.str("type"), "breaker-open") {
		t.Fatalf("open breaker: %v %s", r.Header, r.Raw)
	}
	time.Sleep(1100 * time.Millisecond)
	r = a.do("POST", "/v1/breakers/crm/allow", map[string]any{"call": "probe-1"}).want(t, 200)
	if r.JSON["probe"] != true || r.JSON["breaker"].(map[string]any)["state"] != "half-open" {
		t.Fatalf("after the cooldown: %s", r.Raw)
	}
	a.do("POST", "/v1/breakers/crm/allow", map[string]any{"call": "c2"}).problem(t, 503)
	r = a.do("POST", "/v1/breakers/crm/outcome", map[string]any{"ok": true, "call": "probe-1"}).want(t, 200)
	if r.str("state") != "closed" {
		t.Fatalf("after the probe's success: %s", r.Raw)
	}
	// Open it again, then reset it.
	a.do("POST", "/v1/breakers/crm/outcome", map[string]any{"ok": false}).want(t, 200)
	a.do("POST", "/v1/breakers/crm/outcome", map[string]any{"ok": false}).want(t, 200)
	a.do("GET", "/v1/breakers/crm", nil).want(t, 200)
	if r := a.do("POST", "/v1/breakers/crm/reset", nil).want(t, 200); r.str("state") != "closed" || r.num("consecutive_failures") != 0 {
		t.Fatalf("reset: %s", r.Raw)
	}
	if r := a.do("GET", "/v1/breakers", nil).want(t, 200); len(r.List) != 1 {
		t.Fatalf("list: %s", r.Raw)
	}
	a.do("DELETE", "/v1/breakers/crm", nil).want(t, 204)
	a.do("GET", "/v1/breakers/crm", nil).problem(t, 404)
	a.do("POST", "/v1/breakers/crm/allow", map[string]any{}).problem(t, 404)
	a.do("POST", "/v1/breakers/crm/reset", nil).problem(t, 404)
}

// TestBreakerBadInput: bad input to the breaker routes is a 400 problem
// and writes nothing.
func TestBreakerBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("PUT", "/v1/breakers/crm", map[string]any{}).want(t, 200)
	cases := []badCase{
		{"failures 0", "PUT", "/v1/breakers/crm", map[string]any{"failures": 0}, 0},
		{"failures a string", "PUT", "/v1/breakers/crm", `{"failures":"3"}`, 0},
		{"bad cooldown", "PUT", "/v1/breakers/crm", map[string]any{"cooldown": "later"}, 0},
		{"cooldown too short", "PUT", "/v1/breakers/crm", map[string]any{"cooldown": "1ms"}, 0},
		{"ratio over 1", "PUT", "/v1/breakers/crm", map[string]any{"ratio": 1.5}, 0},
		{"invalid name", "PUT", "/v1/breakers/" + strings.Repeat("b", 129), map[string]any{"failures": 3}, 0},
		{"ok missing", "POST", "/v1/breakers/crm/outcome", map[string]any{"call": "x"}, 0},
		{"ok a string", "POST", "/v1/breakers/crm/outcome", `{"ok":"yes"}`, 0},
		{"call too long", "POST", "/v1/breakers/crm/allow", map[string]any{"call": strings.Repeat("c", 129)}, 0},
		{"invalid name (allow)", "POST", "/v1/breakers/a%2Cb/allow", map[string]any{}, 0},
	}
	cases = append(cases, badBodies("PUT", "/v1/breakers/crm", `{"failures":3}`)...)
	cases = append(cases, badBodies("POST", "/v1/breakers/crm/outcome", `{"ok":true}`)...)
	cases = append(cases, badBodies("POST", "/v1/breakers/crm/allow", `{"call":"c"}`)...)
	checkBad(t, a, cases)
}

// TestFlowAdminRole: with auth on, changing limits, quotas and breakers
// needs the admin role; a write token may take, acquire and report.
func TestFlowAdminRole(t *testing.T) {
	t.Parallel()
	auth, err := httpapi.NewAuth([]httpapi.AuthEntry{
		{Name: "writer", Token: "writer-token-0123456789", Namespaces: []string{"*"}, Role: "write"},
		{Name: "admin", Token: "admin-token-0123456789", Namespaces: []string{"*"}, Role: "admin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	a := newAPI(t, func(c *httpapi.Config) { c.Auth = auth })
	a.token = "writer-token-0123456789"
	sets := []struct {
		method, path string
		body         any
	}{
		{"PUT", "/v1/limits/llm", map[string]any{"rate": "10/s"}},
		{"PUT", "/v1/quotas/db", map[string]any{"limit": 2}},
		{"PUT", "/v1/breakers/crm", map[string]any{"failures": 3}},
		{"POST", "/v1/breakers/crm/reset", nil},
	}
	for _, s := range sets {
		a.do(s.method, s.path, s.body).problem(t, 403)
	}
	a.token = "admin-token-0123456789"
	for _, s := range sets {
		a.do(s.method, s.path, s.body).want(t, 200)
	}
	a.token = "writer-token-0123456789"
	a.do("POST", "/v1/limits/llm/take", map[string]any{"n": 1}).want(t, 200)
	a.do("POST", "/v1/breakers/crm/outcome", map[string]any{"ok": true}).want(t, 200)
	a.do("DELETE", "/v1/limits/llm", nil).problem(t, 403)
	a.do("DELETE", "/v1/quotas/db", nil).problem(t, 403)
	a.do("DELETE", "/v1/breakers/crm", nil).problem(t, 403)
}

// TestBreakerAllowWithoutBody: allow's body is optional; a POST with no
// body at all (and no Content-Type) asks with a call id made up.
func TestBreakerAllowWithoutBody(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("PUT", "/v1/breakers/crm", map[string]any{}).want(t, 200)
	r := a.do("POST", "/v1/breakers/crm/allow", nil).want(t, 200)
	if r.JSON["allowed"] != true || !strings.HasPrefix(r.str("call"), "call-") {
		t.Fatalf("allow without a body: %s", r.Raw)
	}
	a.do("POST", "/v1/breakers/crm/outcome", map[string]any{"ok": true, "call": r.str("call")}).want(t, 200)
}
