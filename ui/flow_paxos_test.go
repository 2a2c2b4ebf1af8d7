package ui_test

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestUIEditLimitRate: a limit's rate edited on the flow page is the
// limit's rate for the API.
func TestUIEditLimitRate(t *testing.T) {
	s := newSite(t)
	s.do("PUT", "/v1/limits/openai-tokens", map[string]any{"rate": "600/m", "burst": 50}, 200)
	tb := newTab(t)
	tb.do("open the flow page", chromedp.Navigate(s.base+"/ui/#/flow"))
	tb.click(`tr[data-limit="openai-tokens"] button`)
	tb.do("type the rate", chromedp.SetValue(chromedp.CSS(`form[data-edit="openai-tokens"] input[name="rate"]`), "120/s"),
		chromedp.Click(chromedp.CSS(`form[data-edit="openai-tokens"] button[type="submit"]`)))
	ok := etcdtest.Eventually(10*time.Second, func() bool {
		return s.do("GET", "/v1/limits/openai-tokens", nil, 200)["rate"] == "120/s"
	})
	if !ok {
		t.Fatalf("the limit is %v after the edit, want 120/s", s.do("GET", "/v1/limits/openai-tokens", nil, 200))
	}
	tb.waitJS("the new rate on the page", `document.querySelector('tr[data-limit="openai-tokens"]').textContent.includes("120/s")`)
	tb.noConsoleErrors()
}

// TestUIPaxosGroup: with a group configured, the Paxos page shows its
// leader, ballot and each node's lag, and a node that does not answer.
func TestUIPaxosGroup(t *testing.T) {
	s := newSite(t, withPaxosGroup(t))
	tb := newTab(t)
	tb.do("open the Paxos page", chromedp.Navigate(s.base+"/ui/#/paxos"))
	tb.waitJS("the nodes", `!!document.querySelector("#paxos table")`)
	text := eval[string](tb, `document.getElementById("paxos").innerText`)
	for _, want := range []string{"node 1 at 127.0.0.1:7101", "4.1", "follower", "down", "12"} {
		if !strings.Contains(text, want) {
			t.Errorf("the Paxos page does not show %q:\n%s", want, text)
		}
	}
	tb.noConsoleErrors()
}

// withPaxosGroup configures a Paxos group of three nodes: a leader and a
// follower 12 slots behind (fake nodes answering GET /status on loopback
// ports) and a node that is down.
func withPaxosGroup(t *testing.T) func(*httpapi.Config) {
	leader := fakePaxosNode(t, `{"id":1,"role":"leader","leader":1,"has_leader":true,"leader_addr":"127.0.0.1:7101","ballot":{"r":4,"n":1},`+
		`"commit":1290,"applied":1290,"members":[{"id":1,"match":1290,"lag":0},{"id":2,"match":1278,"lag":12},{"id":3}]}`)
	follower := fakePaxosNode(t, `{"id":2,"role":"follower","leader":1,"has_leader":true,"ballot":{"r":4,"n":1},"commit":1278,"applied":1278}`)
	down := etcdtest.FreeAddr()
	return func(c *httpapi.Config) { c.PaxosEndpoints = []string{leader, follower, down} }
}

// fakePaxosNode answers status to GET /status on a loopback port until the
// test ends, and returns its address.
func fakePaxosNode(t *testing.T, status string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(status))
	}), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}
