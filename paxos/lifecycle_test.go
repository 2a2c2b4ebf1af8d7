package paxos

import (
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// goroutines returns the stacks of the goroutines now running, by id.
func goroutines() map[string]string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if id, _, ok := strings.Cut(strings.TrimPrefix(g, "goroutine "), " "); ok {
			out[id] = g
		}
	}
	return out
}

// newPaxosGoroutines returns the stacks of the goroutines running this
// package's code that were not in before, waiting a moment for those
// ending (a closed connection's reader) to be gone.
func newPaxosGoroutines(before map[string]string) []string {
	var found []string
	for range 100 {
		found = found[:0]
		for id, g := range goroutines() {
			if _, old := before[id]; !old && strings.Contains(g, "drover/paxos.") && !strings.Contains(g, "testing.tRunner") {
				found = append(found, g)
			}
		}
		if len(found) == 0 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return found
}

// TestTransportsAndStorageLifecycle: every transport's Close and the
// storage's are safe twice, and before anything was sent; once closed, a
// transport's goroutines have ended and a Send starts none.
func TestTransportsAndStorageLifecycle(t *testing.T) {
	before := goroutines()
	msg := func(to NodeID) Message { return Message{Type: MsgHeartbeat, Group: "drover", From: 1, To: to} }

	net := NewMemNetwork(MemDelay(time.Millisecond, 2*time.Millisecond)) // delays run a delivery goroutine
	a, b := net.Transport(1), net.Transport(2)
	_ = a.Send(msg(2))
	for range 2 {
		for _, c := range []interface{ Close() error }{net, a, b} {
			if err := c.Close(); err != nil {
				t.Fatalf("close a memory network part: %v", err)
			}
		}
	}
	_ = a.Send(msg(2))
	idle := NewMemNetwork() // never delivered anything
	for range 2 {
		if err := idle.Close(); err != nil {
			t.Fatal(err)
		}
	}

	srv := NewDirect(DirectConfig{ID: 2})
	hs := httptest.NewServer(srv.Handler())
	d := NewDirect(DirectConfig{ID: 1})
	d.SetPeers([]Peer{{ID: 2, Addr: hs.URL}})
	_ = d.Send(msg(2))
	for range 2 {
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
	}
	hs.Close()
	if err := d.Send(msg(2)); err == nil {
		t.Error("a closed direct transport accepted a message")
	}
	unused := NewDirect(DirectConfig{ID: 3})
	for range 2 {
		if err := unused.Close(); err != nil {
			t.Fatal(err)
		}
	}

	st, _, err := OpenStorage(t.TempDir(), "g", 1, storTestPeers)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := st.Close(); err != nil {
			t.Fatalf("close storage: %v", err)
		}
	}

	if left := newPaxosGoroutines(before); len(left) > 0 {
		t.Fatalf("goroutines of closed transports still run:\n%s", strings.Join(left, "\n\n"))
	}
}

// TestAMQPTransportLifecycle: an AMQP transport's Close is safe twice;
// its goroutines (publisher, consumer, confirms, reconnects) have ended
// when it returns, and Recv is closed.
func TestAMQPTransportLifecycle(t *testing.T) {
	before := goroutines()
	tr := amqpTestDial(t, amqpTestGroup(t), 1)
	_ = tr.Send(Message{Type: MsgHeartbeat, Group: "drover", From: 1, To: 2})
	for range 2 {
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := <-tr.Recv(); ok {
		t.Error("Recv still delivers after Close")
	}
	if left := newPaxosGoroutines(before); len(left) > 0 {
		t.Fatalf("goroutines of a closed AMQP transport still run:\n%s", strings.Join(left, "\n\n"))
	}
}
