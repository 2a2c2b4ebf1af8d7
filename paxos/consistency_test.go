package paxos

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestLockDelayComesFromTheLog: --lock-delay is one node's setting, but
// the table is a replicated state machine: every node must judge a
// lock-delay by the value the leader stamped into the command, or nodes
// with different settings answer the same slot differently and their
// tables diverge. It runs under a leader without a lock-delay (node 0)
// and under one with it (node 1), each pinned so the stamp to expect is
// known: the other nodes' election timeout is an hour, so none of them
// campaigns while the test runs.
func TestLockDelayComesFromTheLog(t *testing.T) {
	for _, pinned := range []NodeID{0, 1} {
		t.Run(fmt.Sprintf("leader %d", pinned), func(t *testing.T) { testLockDelayFromTheLog(t, pinned) })
	}
}

func testLockDelayFromTheLog(t *testing.T, pinned NodeID) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, func(cfg *Config) {
		if cfg.ID != 0 {
			cfg.LockDelay = 10 * time.Minute
		}
		if cfg.ID != pinned {
			cfg.ElectionTimeout = time.Hour
		}
	})
	defer c.close()
	c.startAll()
	lead := c.leader(5 * time.Second)
	if lead.cfg.ID != pinned {
		t.Fatalf("node %d leads, want node %d, the only one whose election timer fires", lead.cfg.ID, pinned)
	}
	// A follower whose setting differs from the leader's.
	var f NodeID
	for _, p := range c.peers {
		if n := c.node(p.ID); n != lead && n.cfg.LockDelay != lead.cfg.LockDelay {
			f = p.ID
			break
		}
	}
	if res := c.mustPropose(f, Command{Op: OpAcquire, Lock: "a", Owner: "o1", TTL: 30}); res.Code != CodeOK {
		t.Fatalf("first acquire = %+v", res)
	}
	time.Sleep(80 * time.Millisecond) // the grant expires
	res := c.mustPropose(f, Command{Op: OpAcquire, Lock: "a", Owner: "o2", TTL: 60000})
	want := CodeOK
	if lead.cfg.LockDelay > 0 {
		want = CodeHeld
	}
	if cur := c.leader(time.Second); cur != lead {
		t.Fatalf("node %d leads now, though node %d was pinned", cur.cfg.ID, pinned)
	}
	if res.Code != want {
		t.Errorf("node %d (lock-delay %s) answered %s under leader %d (lock-delay %s), want %s: the lock-delay must be the leader's, from the log",
			f, c.node(f).cfg.LockDelay, res.Code, lead.cfg.ID, lead.cfg.LockDelay, want)
	}
	c.stopAndCompare()
}

// TestAPIIdempotencyKeyReusedForAnotherRequest: a key names one request.
// Reused for a different one (another op, lock, owner, token or ttl) it
// must not answer the first request's result as if it were this one's.
func TestAPIIdempotencyKeyReusedForAnotherRequest(t *testing.T) {
	_, srv := singleNode(t)
	code, first := call(t, srv, "POST", "/locks/k", `{"owner":"o","ttl":30}`, IdempotencyHeader, "acq-1")
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, first)
	}
	tok := jsonNum(num(t, first, "token"))
	code, rel := call(t, srv, "DELETE", "/locks/k", `{"owner":"o","token":`+tok+`}`, IdempotencyHeader, "rel-1")
	if code != 200 {
		t.Fatalf("release: %d %v", code, rel)
	}
	reuses := []struct{ method, path, body, key string }{
		{"POST", "/locks/k", `{"owner":"o","ttl":30}`, "rel-1"},                           // a release's key for an acquire
		{"POST", "/locks/k", `{"owner":"other","ttl":30}`, "acq-1"},                       // another owner
		{"POST", "/locks/k2", `{"owner":"o","ttl":30}`, "acq-1"},                          // another lock
		{"POST", "/locks/k", `{"owner":"o","ttl":31}`, "acq-1"},                           // another ttl
		{"DELETE", "/locks/k", `{"owner":"o","token":1}`, "rel-1"},                        // another token
		{"POST", "/locks/k/renew", `{"owner":"o","token":` + tok + `,"ttl":30}`, "rel-1"}, // another op
	}
	for _, r := range reuses {
		code, body := call(t, srv, r.method, r.path, r.body, IdempotencyHeader, r.key)
		msg, _ := body["error"].(string)
		if code != 422 || !strings.Contains(msg, "Idempotency-Key "+r.key) || !strings.Contains(msg, "different request") {
			t.Errorf("%s %s %s with key %s: %d %v, want 422 saying the key was used for a different request", r.method, r.path, r.body, r.key, code, body)
		}
	}
	// The original requests still get their own answers.
	code, again := call(t, srv, "POST", "/locks/k", `{"owner":"o","ttl":30}`, IdempotencyHeader, "acq-1")
	if code != 200 || num(t, again, "token") != num(t, first, "token") {
		t.Fatalf("repeated acquire: %d %v, first %v", code, again, first)
	}
	if code, _ := call(t, srv, "DELETE", "/locks/k", `{"owner":"o","token":`+tok+`}`, IdempotencyHeader, "rel-1"); code != 200 {
		t.Fatalf("repeated release: %d, want 200 (the first answer)", code)
	}
}

// TestAPIStatusOfAHaltedNode: a node whose storage failed halts; its
// /status must not keep answering 200 with its last role, or a liveness
// probe never restarts it.
func TestAPIStatusOfAHaltedNode(t *testing.T) {
	node, srv := singleNode(t)
	waitStatus(t, node.Node, 5*time.Second, "leading", func(s NodeStatus) bool { return s.Role == "leader" })
	if code, body := call(t, srv, "GET", "/status", ""); code != 200 || body["role"] != "leader" {
		t.Fatalf("status of a running node: %d %v", code, body)
	}
	_ = node.store.Close() // the disk goes: the next write fails
	call(t, srv, "POST", "/locks/a", `{"owner":"o","ttl":30}`)
	code, body := call(t, srv, "GET", "/status", "")
	msg, _ := body["error"].(string)
	if code != 503 || !strings.Contains(msg, "halted") || !strings.Contains(msg, "restart") || body["role"] == nil {
		t.Fatalf("status of a halted node: %d %v, want 503 with its last view and an error saying it halted", code, body)
	}
	_ = node.Stop()
	if code, body := call(t, srv, "GET", "/status", ""); code != 503 {
		t.Fatalf("status of a stopped node: %d %v, want 503", code, body)
	}
}
