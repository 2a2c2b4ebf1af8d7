package httpapi_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLockSessionLifecycle: a lock acquired under a session has a token;
// a second session gets 409 naming the holder; status and list show it;
// release needs the token and the session; the next holder's token is
// larger.
func TestLockSessionLifecycle(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s1, s2 := a.session(10), a.session(10)
	r := a.do("POST", "/v1/locks/report-42", map[string]any{"session": s1}).want(t, 200)
	tok, cont := int64(r.num("token")), r.str("contender")
	if tok <= 0 || r.str("status") != "acquired" || r.str("session") != s1 {
		t.Fatalf("acquire: %s", r.Raw)
	}
	c := a.do("POST", "/v1/locks/report-42", map[string]any{"session": s2}).problem(t, 409)
	if h, _ := c.JSON["holder"].(map[string]any); h == nil || int64(h["token"].(float64)) != tok {
		t.Fatalf("409 does not name the holder: %s", c.Raw)
	}
	st := a.do("GET", "/v1/locks/report-42", nil).want(t, 200)
	if int64(st.num("token")) != tok || st.JSON["held"] != true {
		t.Fatalf("status: %s", st.Raw)
	}
	if l := a.do("GET", "/v1/locks", nil).want(t, 200); len(l.List) != 1 {
		t.Fatalf("list: %s", l.Raw)
	}
	// Wrong token, wrong session: 409, nothing released.
	a.do("DELETE", fmt.Sprintf("/v1/locks/report-42?token=%d&session=%s&contender=%s", tok+1, s1, cont), nil).problem(t, 409)
	a.do("DELETE", fmt.Sprintf("/v1/locks/report-42?token=%d&session=%s&contender=%s", tok, s2, cont), nil).problem(t, 400)
	a.do("DELETE", fmt.Sprintf("/v1/locks/report-42?token=%d&session=%s", tok, s1), nil).problem(t, 400)
	// Knowing the token and the session is not enough: the contender's
	// random part is the holder's alone.
	forged := cont[:strings.LastIndex(cont[:len(cont)-2], "-")+1] + "aaaaaaaaaaaaaaaaaaaaaaaaaa-0"
	a.do("DELETE", fmt.Sprintf("/v1/locks/report-42?token=%d&session=%s&contender=%s", tok, s1, forged), nil).problem(t, 409)
	a.do("GET", "/v1/locks/report-42", nil).want(t, 200)
	a.do("DELETE", fmt.Sprintf("/v1/locks/report-42?token=%d&session=%s&contender=%s", tok, s1, cont), nil).want(t, 204)
	a.do("GET", "/v1/locks/report-42", nil).problem(t, 404)
	r2 := a.do("POST", "/v1/locks/report-42", map[string]any{"session": s2}).want(t, 200)
	if int64(r2.num("token")) <= tok {
		t.Fatalf("next token %v not above %d", r2.num("token"), tok)
	}
}

// TestLockOwnerTTL: a lock taken with owner and ttl frees itself after
// its ttl, and only its owner releases it: another owner naming the
// right token and contender gets 409 and releases nothing.
func TestLockOwnerTTL(t *testing.T) {
	a := newAPI(t)
	r := a.do("POST", "/v1/locks/res-1", map[string]any{"owner": "client-abc", "ttl": 2}).want(t, 200)
	tok, cont := int64(r.num("token")), r.str("contender")
	a.do("POST", "/v1/locks/res-1", map[string]any{"owner": "client-xyz", "ttl": 2}).problem(t, 409)
	if g := a.do("GET", "/v1/locks/res-1", nil).want(t, 200); g.JSON["holder"].(map[string]any)["id"] != "client-abc" {
		t.Fatalf("holder: %s", g.Raw)
	}
	a.do("DELETE", fmt.Sprintf("/v1/locks/res-1?token=%d&owner=client-abc&contender=%s", tok+1, cont), nil).problem(t, 409)
	if p := a.do("DELETE", fmt.Sprintf("/v1/locks/res-1?token=%d&owner=client-xyz&contender=%s", tok, cont), nil).problem(t, 409); !strings.Contains(p.str("detail"), `owner "client-xyz"`) {
		t.Fatalf("the refusal does not say whose release it refused: %s", p.Raw)
	}
	if g := a.do("GET", "/v1/locks/res-1", nil).want(t, 200); int64(g.num("token")) != tok {
		t.Fatalf("after another owner's release: %s", g.Raw)
	}
	a.do("DELETE", fmt.Sprintf("/v1/locks/res-1?token=%d&contender=%s", tok, cont), nil).problem(t, 400)
	start := time.Now()
	for a.do("GET", "/v1/locks/res-1", nil).Status == 200 {
		if time.Since(start) > 4*time.Second {
			t.Fatal("an owner lock with ttl 2 is still held after 4 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	r = a.do("POST", "/v1/locks/res-1", map[string]any{"owner": "client-xyz", "ttl": 3600}).want(t, 200)
	leases := func() int {
		l, err := a.cli.Leases(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Leases)
	}
	before := leases()
	a.do("DELETE", fmt.Sprintf("/v1/locks/res-1?token=%d&owner=client-xyz&contender=%s", int64(r.num("token")), r.str("contender")), nil).want(t, 204)
	if after := leases(); after != before-1 {
		t.Fatalf("leases %d before the owner lock's release, %d after: its lease was not revoked", before, after)
	}
	// The task runner's locks are taken only through the agent-task routes.
	a.do("POST", "/v1/locks/task:job-1", map[string]any{"owner": "x", "ttl": 5}).problem(t, 400)
}

// TestLockWaitInLine: ?wait= waits for the holder's release and then
// acquires; a wait that ends first gets 409.
func TestLockWaitInLine(t *testing.T) {
	a := newAPI(t)
	s1, s2 := a.session(10), a.session(10)
	first := a.do("POST", "/v1/locks/w", map[string]any{"session": s1}).want(t, 200)
	tok := int64(first.num("token"))
	start := time.Now()
	a.do("POST", "/v1/locks/w?wait=300ms", map[string]any{"session": s2}).problem(t, 409)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("gave up after %s, before the 300ms wait", d)
	}
	var wg sync.WaitGroup
	var got resp
	wg.Add(1)
	go func() { defer wg.Done(); got = a.do("POST", "/v1/locks/w?wait=5s", map[string]any{"session": s2}) }()
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	a.do("DELETE", fmt.Sprintf("/v1/locks/w?token=%d&session=%s&contender=%s", tok, s1, first.str("contender")), nil).want(t, 204)
	wg.Wait()
	got.want(t, 200)
	if d := time.Since(released); d > time.Second {
		t.Fatalf("the waiter took the lock %s after the release", d)
	}
}

// TestLockFreedWhenSessionStops: a session that stops its keepalives loses
// its lock within TTL + 1 s; another session then takes it.
func TestLockFreedWhenSessionStops(t *testing.T) {
	a := newAPI(t)
	s1, s2 := a.session(2), a.session(10)
	a.do("POST", "/v1/locks/l", map[string]any{"session": s1}).want(t, 200)
	start := time.Now()
	r := a.do("POST", "/v1/locks/l?wait=5s", map[string]any{"session": s2}).want(t, 200)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("freed after %s, more than TTL + 1 s", d)
	}
	if r.str("session") != s2 {
		t.Fatalf("acquired: %s", r.Raw)
	}
	// The dead session cannot acquire anything.
	a.do("POST", "/v1/locks/other", map[string]any{"session": s1}).problem(t, 404)
}

// TestLockMutualExclusion: 8 sessions race for one lock through the API,
// 20 acquisitions each; at most one holds it at any time, counted by a
// shared counter that each holder raises and lowers. A wait that ends
// held by another (409, the machine too busy for 5 s) is tried again, at
// most 100 tries a session, so every session gets its 20.
func TestLockMutualExclusion(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	var mu sync.Mutex
	inside, maxInside, acquired := 0, 0, 0
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		sid := a.session(10)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for got, tries := 0, 0; got < 20 && tries < 100; tries++ {
				r := a.do("POST", "/v1/locks/mx?wait=5s", map[string]any{"session": sid})
				if r.Status == 409 {
					continue
				}
				if r.Status != 200 {
					t.Errorf("acquire: %d %s", r.Status, r.Raw)
					return
				}
				got++
				mu.Lock()
				inside++
				acquired++
				maxInside = max(maxInside, inside)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				inside--
				mu.Unlock()
				a.do("DELETE", fmt.Sprintf("/v1/locks/mx?token=%d&session=%s&contender=%s", int64(r.num("token")), sid, r.str("contender")), nil)
			}
		}()
	}
	wg.Wait()
	if maxInside != 1 || acquired != 160 {
		t.Fatalf("max holders at once %d (want 1), acquisitions %d (want 160)", maxInside, acquired)
	}
}

// TestLockReleaseByContender: the contender the acquisition returned
// releases in one step; another session cannot name it (400), a wrong
// token is refused (409) and releases nothing.
func TestLockReleaseByContender(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s1, s2 := a.session(10), a.session(10)
	r := a.do("POST", "/v1/locks/c", map[string]any{"session": s1}).want(t, 200)
	tok, cont := int64(r.num("token")), r.str("contender")
	if cont == "" {
		t.Fatalf("no contender: %s", r.Raw)
	}
	a.do("DELETE", fmt.Sprintf("/v1/locks/c?token=%d&session=%s&contender=%s", tok, s2, cont), nil).problem(t, 400)
	a.do("DELETE", fmt.Sprintf("/v1/locks/c?token=%d&contender=%s", tok, "zz-1"), nil).problem(t, 400)
	a.do("DELETE", fmt.Sprintf("/v1/locks/c?token=%d&session=%s&contender=%s", tok+1, s1, cont), nil).problem(t, 409)
	a.do("GET", "/v1/locks/c", nil).want(t, 200)
	a.do("DELETE", fmt.Sprintf("/v1/locks/c?token=%d&session=%s&contender=%s", tok, s1, cont), nil).want(t, 204)
	a.do("GET", "/v1/locks/c", nil).problem(t, 404)
}
