package paxos

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// counted wraps a real node and counts what reaches it, so a test can
// assert that a refused request proposed nothing.
type counted struct {
	*Node
	proposals atomic.Int64
}

func (c *counted) Propose(ctx context.Context, cmd Command) (Result, error) {
	c.proposals.Add(1)
	return c.Node.Propose(ctx, cmd)
}

func (c *counted) AddNode(ctx context.Context, p Peer) error {
	c.proposals.Add(1)
	return c.Node.AddNode(ctx, p)
}

func (c *counted) RemoveNode(ctx context.Context, id NodeID) error {
	c.proposals.Add(1)
	return c.Node.RemoveNode(ctx, id)
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// startAPINode starts node 0 of a group whose members are peers (node 0
// first) over the direct transport, serves its API on an httptest server,
// and stops both at the end of the test. With other members that never
// run, the node has no quorum.
func startAPINode(t *testing.T, peers []Peer, cfg APIConfig) (*counted, *httptest.Server) {
	t.Helper()
	tr := NewDirect(DirectConfig{ID: 0, Group: "api-test"})
	node, err := NewNode(Config{ID: 0, Group: "api-test", Peers: peers, Transport: tr, DataDir: t.TempDir(),
		Heartbeat: 10 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := &counted{Node: node}
	cfg.Direct = tr.Handler()
	srv := httptest.NewServer(NewAPI(c, cfg))
	t.Cleanup(func() {
		srv.Close()
		_ = node.Stop()
		_ = tr.Close()
	})
	return c, srv
}

// singleNode starts a group of one node: it has a quorum by itself.
func singleNode(t *testing.T) (*counted, *httptest.Server) {
	t.Helper()
	return startAPINode(t, []Peer{{ID: 0}}, APIConfig{})
}

// call sends a request with a raw body and decodes the JSON answer.
func call(t *testing.T, srv *httptest.Server, method, path, body string, hdr ...string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q", method, path, ct)
	}
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: answer is not a JSON object: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// num reads a JSON number field.
func num(t *testing.T, m map[string]any, key string) float64 {
	t.Helper()
	v, ok := m[key].(float64)
	if !ok {
		t.Fatalf("%q is not a number in %v", key, m)
	}
	return v
}

// TestAPISeedShapes checks the seed's routes (acquire, read) and the added
// ones (release, renew, list, status) answer with the documented status
// codes and bodies.
func TestAPISeedShapes(t *testing.T) {
	_, srv := singleNode(t)
	before := time.Now().UnixMilli()
	code, body := call(t, srv, "POST", "/locks/res-1", `{"owner":"client-abc","ttl":30}`)
	if code != 200 || body["status"] != "acquired" {
		t.Fatalf("acquire: %d %v", code, body)
	}
	details, _ := body["details"].(map[string]any)
	if details["lockId"] != "res-1" || details["owner"] != "client-abc" {
		t.Fatalf("acquire details: %v", details)
	}
	expires, token := num(t, details, "expires"), num(t, body, "token")
	if expires < float64(before+30_000) || expires > float64(time.Now().UnixMilli()+30_000) || token < 1 {
		t.Fatalf("acquire: expires %v (want about now+30s), token %v", expires, token)
	}

	code, body = call(t, srv, "POST", "/locks/res-1", `{"owner":"client-xyz","ttl":30}`)
	holder, _ := body["holder"].(map[string]any)
	if code != 409 || body["error"] != "Lock already held" || holder["owner"] != "client-abc" || num(t, holder, "token") != token {
		t.Fatalf("acquire of a held lock: %d %v", code, body)
	}
	code, body = call(t, srv, "GET", "/locks/res-1", "")
	if code != 200 || body["owner"] != "client-abc" || num(t, body, "expires") != expires || num(t, body, "token") != token {
		t.Fatalf("get: %d %v", code, body)
	}
	code, body = call(t, srv, "GET", "/locks/res-2", "")
	if code != 404 || body["error"] != "Lock not found or expired" {
		t.Fatalf("get of a free lock: %d %v", code, body)
	}

	code, body = call(t, srv, "POST", "/locks/res-1/renew", `{"owner":"client-xyz","token":1,"ttl":60}`)
	if code != 409 || !strings.Contains(body["error"].(string), "Not the lock holder") {
		t.Fatalf("renew by another owner: %d %v", code, body)
	}
	code, body = call(t, srv, "POST", "/locks/res-1/renew", `{"owner":"client-abc","token":`+jsonNum(token)+`,"ttl":60}`)
	if code != 200 || body["status"] != "renewed" || num(t, body, "expires") < expires+29_000 {
		t.Fatalf("renew: %d %v", code, body)
	}

	if code, body = call(t, srv, "POST", "/locks/res-0", `{"owner":"o","ttl":0.5,"holder":{"host":"h1","pid":7}}`); code != 200 {
		t.Fatalf("acquire res-0: %d %v", code, body)
	}
	code, body = call(t, srv, "GET", "/locks", "")
	data, _ := body["data"].([]any)
	if code != 200 || len(data) != 2 || data[0].(map[string]any)["lockId"] != "res-0" || data[1].(map[string]any)["lockId"] != "res-1" {
		t.Fatalf("list: %d %v", code, body)
	}
	if h, _ := data[0].(map[string]any)["holder"].(map[string]any); h["host"] != "h1" || h["pid"] != float64(7) {
		t.Fatalf("list: holder object not returned: %v", data[0])
	}

	code, body = call(t, srv, "DELETE", "/locks/res-1", `{"owner":"client-abc","token":`+jsonNum(token+1000)+`}`)
	if code != 409 || body["holder"] == nil {
		t.Fatalf("release with a wrong token: %d %v", code, body)
	}
	code, body = call(t, srv, "DELETE", "/locks/res-1", `{"owner":"client-abc","token":`+jsonNum(token)+`}`)
	if code != 200 || body["status"] != "released" {
		t.Fatalf("release: %d %v", code, body)
	}
	if code, body = call(t, srv, "DELETE", "/locks/res-1", `{"owner":"client-abc","token":`+jsonNum(token)+`}`); code != 409 {
		t.Fatalf("second release: %d %v", code, body)
	}
	if code, _ = call(t, srv, "GET", "/locks/res-1", ""); code != 404 {
		t.Fatalf("get after release: %d", code)
	}
	code, body = call(t, srv, "GET", "/status", "")
	if code != 200 || body["role"] == nil || num(t, body, "commit") < 1 {
		t.Fatalf("status: %d %v", code, body)
	}
}

func jsonNum(f float64) string {
	b, _ := json.Marshal(f)
	return string(b)
}

// TestAPIBadRequests checks that malformed, oversize or invalid requests
// get 400 with a message naming the field and the rule, and propose
// nothing.
func TestAPIBadRequests(t *testing.T) {
	node, srv := singleNode(t)
	big := `{"owner":"` + strings.Repeat("x", MaxBodyBytes) + `","ttl":1}`
	cases := []struct {
		name, method, path, body string
		hdr                      []string
		want                     string
	}{
		{"malformed JSON", "POST", "/locks/a", `{"owner":`, nil, "malformed JSON"},
		{"not an object", "POST", "/locks/a", `[1,2]`, nil, "JSON object"},
		{"trailing data", "POST", "/locks/a", `{"owner":"o","ttl":1} {}`, nil, "data follows it"},
		{"unknown field", "POST", "/locks/a", `{"owner":"o","ttl":1,"color":"red"}`, nil, `unknown field "color"`},
		{"ttl of the wrong type", "POST", "/locks/a", `{"owner":"o","ttl":"10"}`, nil, "ttl must be a number"},
		{"owner of the wrong type", "POST", "/locks/a", `{"owner":5,"ttl":1}`, nil, "owner must be a string"},
		{"oversize body", "POST", "/locks/a", big, nil, "larger than"},
		{"missing owner", "POST", "/locks/a", `{"ttl":1}`, nil, "owner and ttl are required"},
		{"missing ttl", "POST", "/locks/a", `{"owner":"o"}`, nil, "owner and ttl are required"},
		{"empty body", "POST", "/locks/a", ``, nil, "owner and ttl are required"},
		{"negative ttl", "POST", "/locks/a", `{"owner":"o","ttl":-1}`, nil, "ttl must be a number of seconds above 0"},
		{"ttl over a day", "POST", "/locks/a", `{"owner":"o","ttl":86401}`, nil, "at most 86400"},
		{"owner too long", "POST", "/locks/a", `{"owner":"` + strings.Repeat("o", MaxOwnerBytes+1) + `","ttl":1}`, nil, "owner must be at most"},
		{"holder not an object", "POST", "/locks/a", `{"owner":"o","ttl":1,"holder":"me"}`, nil, "holder must be a JSON object"},
		{"bad lock id", "POST", "/locks/a%20b", `{"owner":"o","ttl":1}`, nil, "invalid lock id"},
		{"lock id too long", "GET", "/locks/" + strings.Repeat("k", 129), ``, nil, "invalid lock id"},
		{"escaped slash in lock id", "GET", "/locks/a%2Fb", ``, nil, "invalid lock id"},
		{"release without token", "DELETE", "/locks/a", `{"owner":"o"}`, nil, "owner and token are required"},
		{"release with ttl", "DELETE", "/locks/a", `{"owner":"o","token":3,"ttl":1}`, nil, `unknown field "ttl"`},
		{"negative token", "DELETE", "/locks/a", `{"owner":"o","token":-3}`, nil, "token must be a whole number"},
		{"renew without ttl", "POST", "/locks/a/renew", `{"owner":"o","token":3}`, nil, "owner, token and ttl are required"},
		{"renew with a bad ttl", "POST", "/locks/a/renew", `{"owner":"o","token":3,"ttl":-2}`, nil, "ttl must be"},
		{"member without id", "POST", "/members", `{"addr":"127.0.0.1:1"}`, nil, "id is required"},
		{"member with a bad addr", "POST", "/members", `{"id":4,"addr":"nowhere"}`, nil, "must be host:port"},
		{"member id not a number", "DELETE", "/members/x", ``, nil, "must be a node id"},
		{"bad idempotency key", "GET", "/locks/a", ``, []string{IdempotencyHeader, strings.Repeat("k", 200)}, IdempotencyHeader},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := node.proposals.Load()
			code, body := call(t, srv, tc.method, tc.path, tc.body, tc.hdr...)
			msg, _ := body["error"].(string)
			t.Log(msg)
			if code != 400 || !strings.Contains(msg, tc.want) {
				t.Fatalf("%d %q, want 400 with %q", code, msg, tc.want)
			}
			if n := node.proposals.Load() - before; n != 0 {
				t.Fatalf("a refused request proposed %d commands", n)
			}
		})
	}
}

// TestAPIRoutes checks wrong methods and unknown paths answer JSON.
func TestAPIRoutes(t *testing.T) {
	_, srv := singleNode(t)
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"PUT", "/locks/a", 405}, {"GET", "/locks/a/renew", 405}, {"POST", "/status", 405},
		{"DELETE", "/locks", 405}, {"GET", "/members", 405}, {"GET", "/nowhere", 404}, {"GET", "/locks/a/b/c", 404},
	} {
		code, body := call(t, srv, tc.method, tc.path, "")
		if code != tc.code || body["error"] == nil {
			t.Fatalf("%s %s: %d %v, want %d with an error", tc.method, tc.path, code, body, tc.code)
		}
	}
}

// TestAPIConsensusTimeout checks a node without a quorum answers 504
// {"error":"Consensus timeout"} within the request timeout, for writes and
// reads alike.
func TestAPIConsensusTimeout(t *testing.T) {
	peers := []Peer{{ID: 0}, {ID: 1, Addr: freeAddr(t)}, {ID: 2, Addr: freeAddr(t)}}
	_, srv := startAPINode(t, peers, APIConfig{RequestTimeout: 300 * time.Millisecond})
	for _, r := range [][3]string{{"POST", "/locks/a", `{"owner":"o","ttl":5}`}, {"GET", "/locks/a", ""}, {"GET", "/locks", ""}} {
		start := time.Now()
		code, body := call(t, srv, r[0], r[1], r[2])
		if code != 504 || body["error"] != "Consensus timeout" {
			t.Fatalf("%s %s without a quorum: %d %v", r[0], r[1], code, body)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("504 after %s, want about the 300ms request timeout", d)
		}
	}
	if code, _ := call(t, srv, "GET", "/status", ""); code != 200 {
		t.Fatalf("status without a quorum: %d, want 200 (it is answered locally)", code)
	}
}

// TestAPIIdempotencyKey checks a request repeated with the same key is
// applied once and gets the first answer.
func TestAPIIdempotencyKey(t *testing.T) {
	_, srv := singleNode(t)
	_, first := call(t, srv, "POST", "/locks/k", `{"owner":"o","ttl":30}`, IdempotencyHeader, "req-1")
	code, again := call(t, srv, "POST", "/locks/k", `{"owner":"o","ttl":30}`, IdempotencyHeader, "req-1")
	if code != 200 || num(t, again, "token") != num(t, first, "token") {
		t.Fatalf("repeated acquire: %d %v, first %v", code, again, first)
	}
	if code, _ := call(t, srv, "POST", "/locks/k", `{"owner":"o","ttl":30}`, IdempotencyHeader, "req-2"); code != 409 {
		t.Fatalf("acquire with another key: %d, want 409", code)
	}
}

// TestAPIStoppedNode checks a stopped node answers 503, so clients try
// another.
func TestAPIStoppedNode(t *testing.T) {
	node, srv := singleNode(t)
	_ = node.Stop()
	code, body := call(t, srv, "GET", "/locks/a", "")
	if code != 503 || !strings.Contains(body["error"].(string), "another node") {
		t.Fatalf("stopped node: %d %v", code, body)
	}
}

// TestAPIBodyLimitExact checks a body of exactly 1 MiB is read.
func TestAPIBodyLimitExact(t *testing.T) {
	_, srv := singleNode(t)
	pad := MaxBodyBytes - len(`{"owner":"o","ttl":1}`)
	body := `{"owner":"o","ttl":1}` + strings.Repeat(" ", pad)
	resp, err := srv.Client().Post(srv.URL+"/locks/exact", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a 1 MiB body: %d", resp.StatusCode)
	}
}
