package budget_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// waitLive polls c's budget until it has live reservations, bounded by a
// minute of polls (the lease's end is etcd's: the test counts outcomes,
// it asserts no time).
func waitLive(t *testing.T, c *budget.Client, live int) budget.Usage {
	t.Helper()
	for range 600 {
		s := status(t, c)
		if s.Live == live {
			return s
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the budget still has %d live reservations after 600 polls, want %d", status(t, c).Live, live)
	return budget.Usage{}
}

// TestSettleAfterClockPassedTTL: a settle of a reservation with a lease of
// its own counts once the settling client's clock passed its ttl, as long
// as etcd has not ended the lease: a clock does not judge the lease.
func TestSettleAfterClockPassedTTL(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 1000, WindowSeconds: 86400}, budget.WithClock(clk.Now))
	late, err := c.Reserve(ctx, key, "acme", 300, budget.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	if want := late.ReservedAt.Add(time.Minute); !late.ExpiresAt.Equal(want) {
		t.Fatalf("expires_at %v, want %v", late.ExpiresAt, want)
	}
	clk.Add(59 * time.Second)
	inTime, err := c.Reserve(ctx, key, "acme", 100, budget.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Second) // late's expires_at is now by this clock; etcd's lease lives on
	if _, err := c.Settle(ctx, late, 250, nil); err != nil {
		t.Fatalf("settle at expires_at by the clock, the lease alive in etcd: %v", err)
	}
	if _, err := c.Settle(ctx, inTime, 80, nil); err != nil {
		t.Fatalf("settle within the lease: %v", err)
	}
	if s := status(t, c); s.Used != 330 || s.Reserved != 0 || s.Live != 0 {
		t.Fatalf("after two settles: used %d, reserved %d, live %d; want 330, 0, 0", s.Used, s.Reserved, s.Live)
	}
}

// TestSettleThroughSkewedServer: a reservation made by a client whose
// clock is 90 s behind the settling one's (ttl 60) is settled through the
// other a moment later, and its tokens count.
func TestSettleThroughSkewedServer(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	behind := func() time.Time { return clk.Now().Add(-90 * time.Second) }
	ns := etcdtest.Namespace(t)
	reserver := budget.New(srv.Client(t), ns, budget.WithClock(behind))
	defer reserver.Close()
	settler := budget.New(srv.Client(t), ns, budget.WithClock(clk.Now))
	defer settler.Close()
	if _, err := settler.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	r, err := reserver.Reserve(ctx, key, "acme", 300, budget.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Second)
	s, err := settler.Settle(ctx, r, 250, nil)
	if err != nil || s.Actual != 250 {
		t.Fatalf("settle through the server 90 s ahead: %+v %v, want 250 counted", s, err)
	}
	if u := status(t, settler); u.Used != 250 || u.Reserved != 0 || u.Live != 0 {
		t.Fatalf("after the settle: used %d, reserved %d, live %d; want 250, 0, 0", u.Used, u.Reserved, u.Live)
	}
}

// TestSettleAfterLeaseEnded: reservations whose real etcd leases ended
// unsettled cannot be settled, from the client that made them (whose
// cached view still holds them) or another, and none of their tokens
// count.
func TestSettleAfterLeaseEnded(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock() // fixed: only etcd's lease ends, not the client's clock
	ns := etcdtest.Namespace(t)
	c := budget.New(srv.Client(t), ns, budget.WithClock(clk.Now))
	defer c.Close()
	other := budget.New(srv.Client(t), ns, budget.WithClock(clk.Now))
	defer other.Close()
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	var rs []budget.Reservation
	for range 4 {
		r, err := c.Reserve(ctx, key, "acme", 100, budget.WithTTL(1))
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	waitLive(t, c, 0)
	refused := 0
	for i, r := range rs {
		by := c
		if i%2 == 1 {
			by = other
		}
		if _, err := by.Settle(ctx, r, 90, nil); errors.Is(err, budget.ErrNotReserved) {
			refused++
		} else {
			t.Errorf("settle %d after its lease ended: %v, want ErrNotReserved", i, err)
		}
	}
	if s := status(t, c); refused != 4 || s.Used != 0 || s.Reserved != 0 || s.RequestsUsed != 4 {
		t.Fatalf("%d of 4 late settles refused; budget used %d, reserved %d, requests %d; want 0, 0, 4", refused, s.Used, s.Reserved, s.RequestsUsed)
	}
}

// TestHTTPSettleAfterRelease: over HTTP, a settle of a reservation etcd
// already released (its ttl_seconds ended and the key is gone) is a 409
// problem and counts nothing. It checks the outcome once the key is gone;
// it does not single out the lease check made before the key is read.
func TestHTTPSettleAfterRelease(t *testing.T) {
	b := serve(t) + "/v1/budgets/" + url.PathEscape(key)
	if code, _, out := call(t, http.MethodPut, b, map[string]any{"tokens": 1000, "window_seconds": 86400}); code != 200 {
		t.Fatalf("set: %d %v", code, out)
	}
	code, _, res := call(t, http.MethodPost, b+"/reserve", map[string]any{"estimate": 600, "ttl_seconds": 1})
	if code != 201 || res["expires_at"] == nil {
		t.Fatalf("reserve: %d %v, want 201 with expires_at", code, res)
	}
	for i := 0; ; i++ {
		_, _, out := call(t, http.MethodGet, b, nil)
		if out["live"] == 0.0 {
			break
		}
		if i == 600 {
			t.Fatalf("the 1 s reservation is still live after 600 polls: %v", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	settle := b + "/reservations/" + res["id"].(string) + "/settle"
	if code, _, out := call(t, http.MethodPost, settle, map[string]any{"actual": 500}); code != 409 {
		t.Fatalf("settle after the lease ended: %d %v, want 409", code, out)
	}
	if _, _, out := call(t, http.MethodGet, b, nil); out["used"] != 0.0 || out["reserved"] != 0.0 {
		t.Fatalf("after the refused settle: %v, want nothing used or reserved", out)
	}
}

// TestHTTPClockSkew: a reservation whose budget's counters were written by
// a clock far ahead of the server's is a 503 problem with Retry-After 30,
// the counters untouched.
func TestHTTPClockSkew(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	base := serveNS(t, ns)
	ahead := budget.New(srv.Client(t), ns, budget.WithClock(func() time.Time { return time.Now().Add(24 * time.Hour) }))
	defer ahead.Close()
	if _, err := ahead.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	r, err := ahead.Reserve(ctx, key, "acme", 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ahead.Settle(ctx, r, 100, nil); err != nil {
		t.Fatal(err)
	}
	b := base + "/v1/budgets/" + url.PathEscape(key)
	code, h, p := call(t, http.MethodPost, b+"/reserve", map[string]any{"estimate": 10})
	if code != 503 || h.Get("Retry-After") != strconv.Itoa(30) || p["status"] != 503.0 {
		t.Fatalf("reserve under a clock a day behind the counters: %d %v %v, want a 503 problem with Retry-After 30", code, h, p)
	}
	if _, _, out := call(t, http.MethodGet, b, nil); out["requests_used"] != 1.0 {
		t.Fatalf("the counters changed: %v", out)
	}
}

// TestDefaultEstimateByTaskType: a reservation without an estimate that
// names its task type holds the budget's default for that type (0 for a
// type it does not name); bad defaults are refused and nothing is written.
func TestDefaultEstimateByTaskType(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 1000, WindowSeconds: 60, Estimates: map[string]int64{"summarize": 400}}, budget.WithClock(clk.Now))
	r, err := c.Reserve(ctx, key, "acme", 0, budget.WithTaskType("summarize"))
	if err != nil || r.Estimate != 400 || r.TaskType != "summarize" {
		t.Fatalf("reserve of a summarize without an estimate: %+v %v, want 400 held", r, err)
	}
	if r2, err := c.Reserve(ctx, key, "acme", 50, budget.WithTaskType("summarize")); err != nil || r2.Estimate != 50 {
		t.Fatalf("an explicit estimate: %+v %v, want 50 held", r2, err)
	}
	if r3, err := c.Reserve(ctx, key, "acme", 0, budget.WithTaskType("classify")); err != nil || r3.Estimate != 0 {
		t.Fatalf("a type without a default: %+v %v, want 0 held", r3, err)
	}
	if s := status(t, c); s.Reserved != 450 {
		t.Fatalf("reserved %d, want 450", s.Reserved)
	}
	before := status(t, c)
	for _, bad := range []map[string]int64{{"summarize": 0}, {"summarize": -5}, {"summarize": 1001}, {"no spaces": 10}} {
		var in *drover.InputError
		if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 60, Estimates: bad}); !errors.As(err, &in) || !strings.HasPrefix(in.Field, "estimates") {
			t.Fatalf("estimates %v: %v, want an InputError naming estimates", bad, err)
		}
	}
	if _, err := c.Reserve(ctx, key, "acme", 0, budget.WithTaskType("bad type")); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("a bad task type: %v, want an InputError", err)
	}
	if after := status(t, c); !reflect.DeepEqual(before, after) {
		t.Fatalf("refused input changed the budget:\n%+v\n%+v", before, after)
	}
	// A default above a tenant's cap could never be admitted.
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 60, Caps: map[string]int64{"trial": 100}, Estimates: map[string]int64{"summarize": 400}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, key, "trial", 0, budget.WithTaskType("summarize")); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("a default above the tenant's cap: %v, want an InputError", err)
	}
}

// TestHTTPDefaultEstimate: over HTTP, estimates are set with the budget
// and a reserve with task_type and no estimate holds the type's default;
// bad ones are 400 problems naming the field.
func TestHTTPDefaultEstimate(t *testing.T) {
	b := serve(t) + "/v1/budgets/" + url.PathEscape(key)
	// A day's window: the server's clock is real, and a window turning
	// between the reserve and the read would show nothing reserved.
	if code, _, out := call(t, http.MethodPut, b, map[string]any{"tokens": 1000, "window_seconds": 86400, "estimates": map[string]int64{"summarize": 300}}); code != 200 ||
		out["estimates"].(map[string]any)["summarize"] != 300.0 {
		t.Fatalf("set: %d %v", code, out)
	}
	if code, _, res := call(t, http.MethodPost, b+"/reserve", map[string]any{"task_type": "summarize"}); code != 201 || res["estimate"] != 300.0 || res["task_type"] != "summarize" {
		t.Fatalf("reserve by task type: %d %v", code, res)
	}
	for _, c := range []struct {
		body     map[string]any
		location string
	}{
		{map[string]any{"tokens": 1000, "estimates": map[string]int64{"summarize": 2000}}, "body.estimates.summarize"},
		{map[string]any{"tokens": 1000, "estimates": map[string]int64{"summarize": -1}}, "body.estimates.summarize"},
	} {
		code, _, p := call(t, http.MethodPut, b, c.body)
		errs, _ := p["errors"].([]any)
		if code != 400 || len(errs) == 0 || errs[0].(map[string]any)["location"] != c.location {
			t.Fatalf("set %v: %d %v, want 400 at %s", c.body, code, p, c.location)
		}
	}
	code, _, p := call(t, http.MethodPost, b+"/reserve", map[string]any{"task_type": "no spaces"})
	if errs, _ := p["errors"].([]any); code != 400 || len(errs) == 0 || errs[0].(map[string]any)["location"] != "body.task_type" {
		t.Fatalf("reserve with a bad task type: %d %v", code, p)
	}
	// No estimate and no default to stand for it: a 400 naming estimate,
	// nothing held.
	for _, body := range []map[string]any{{}, {"tenant": "acme"}, {"task_type": "classify"}} {
		code, _, p := call(t, http.MethodPost, b+"/reserve", body)
		if errs, _ := p["errors"].([]any); code != 400 || len(errs) == 0 || errs[0].(map[string]any)["location"] != "body.estimate" {
			t.Fatalf("reserve %v: %d %v, want 400 at body.estimate", body, code, p)
		}
	}
	if _, _, out := call(t, http.MethodGet, b, nil); out["reserved"] != 300.0 || out["requests_used"] != 1.0 {
		t.Fatalf("refused reserves held something: %v", out)
	}
	if code, _, res := call(t, http.MethodPost, b+"/reserve", map[string]any{"estimate": 0}); code != 201 || res["estimate"] != 0.0 {
		t.Fatalf("reserve of an explicit 0: %d %v, want 201", code, res)
	}
}

// TestListCountsLive: the list counts each budget's live reservations
// (count-only reads), without summing them.
func TestListCountsLive(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 1000, WindowSeconds: 60}, budget.WithClock(clk.Now))
	for range 3 {
		if _, err := c.Reserve(ctx, key, "acme", 10); err != nil {
			t.Fatal(err)
		}
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 || list[0].Live != 3 || list[0].Reserved != 0 {
		t.Fatalf("list: %+v %v, want one budget with 3 live reservations", list, err)
	}
}
