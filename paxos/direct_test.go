package paxos

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// xportTestWriter sends a transport's log lines to the test log.
type xportTestWriter struct{ t testing.TB }

func (w xportTestWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func xportTestLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(xportTestWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// xportWaitFor polls cond every 10ms until it holds or timeout passes.
func xportWaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// xportRecvOne waits up to timeout for one message.
func xportRecvOne(tr Transport, timeout time.Duration) (Message, bool) {
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case m, ok := <-tr.Recv():
		return m, ok
	case <-tm.C:
		return Message{}, false
	}
}

// xportExchange has every node send perPair messages to every other node
// and checks each node gets exactly the messages addressed to it, each
// once, from each peer.
func xportExchange(t *testing.T, trs []Transport, ids []NodeID, group string, perPair int) {
	t.Helper()
	type key struct {
		from NodeID
		seq  uint64
	}
	got := make([]map[key]int, len(trs))
	var wg sync.WaitGroup
	for i, tr := range trs {
		got[i] = make(map[key]int)
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := (len(trs) - 1) * perPair
			for n := 0; n < want; n++ {
				m, ok := xportRecvOne(tr, 20*time.Second)
				if !ok {
					t.Errorf("node %d: got %d of %d messages", ids[i], n, want)
					return
				}
				if m.To != ids[i] || m.Group != group || m.Type != MsgAccepted {
					t.Errorf("node %d got a message not meant for it: %+v", ids[i], m)
				}
				got[i][key{m.From, m.Seq}]++
			}
		}()
	}
	for s := 1; s <= perPair; s++ {
		for i, tr := range trs {
			for j := range trs {
				if i == j {
					continue
				}
				m := Message{Type: MsgAccepted, From: ids[i], To: ids[j], Seq: uint64(s), Slot: uint64(s)}
				if err := tr.Send(m); err != nil {
					t.Fatalf("send %d->%d #%d: %v", ids[i], ids[j], s, err)
				}
			}
		}
	}
	wg.Wait()
	for i := range trs {
		for j := range trs {
			for s := 1; s <= perPair && i != j; s++ {
				if c := got[i][key{ids[j], uint64(s)}]; c != 1 {
					t.Fatalf("node %d got message %d from node %d %d times, want once", ids[i], s, ids[j], c)
				}
			}
		}
	}
}

// directTestNode is a direct transport behind an HTTP test server on
// 127.0.0.1.
type directTestNode struct {
	tr   *DirectTransport
	srv  *httptest.Server
	addr string
}

func directTestStart(t *testing.T, group string, id NodeID, addr string) *directTestNode {
	t.Helper()
	tr := NewDirect(DirectConfig{ID: id, Group: group, Logger: xportTestLogger(t)})
	mux := http.NewServeMux()
	mux.Handle(DirectStreamPath, tr.Handler())
	srv := httptest.NewUnstartedServer(mux)
	if addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen again on %s: %v", addr, err)
		}
		_ = srv.Listener.Close()
		srv.Listener = ln
	}
	srv.Start()
	n := &directTestNode{tr: tr, srv: srv, addr: srv.Listener.Addr().String()}
	t.Cleanup(n.stop)
	return n
}

// stop closes the transport first (it owns the hijacked streams), then
// the server.
func (n *directTestNode) stop() {
	_ = n.tr.Close()
	n.srv.Close()
}

func directTestGroup(t *testing.T, group string, n int) ([]*directTestNode, []Transport, []NodeID) {
	t.Helper()
	nodes := make([]*directTestNode, n)
	trs := make([]Transport, n)
	ids := make([]NodeID, n)
	peers := make([]Peer, n)
	for i := range nodes {
		ids[i] = NodeID(i + 1)
		nodes[i] = directTestStart(t, group, ids[i], "")
		trs[i] = nodes[i].tr
		peers[i] = Peer{ID: ids[i], Addr: nodes[i].addr}
	}
	for _, nd := range nodes {
		nd.tr.SetPeers(peers)
	}
	return nodes, trs, ids
}

func TestDirectThreeNodesExchangeManyMessages(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	nodes, trs, ids := directTestGroup(t, "g1", 3)
	xportExchange(t, trs, ids, "g1", 1000)
	for _, nd := range nodes {
		// Counters move just after the channel operation they count.
		xportWaitFor(t, 5*time.Second, "counters settled", func() bool {
			st := nd.tr.Stats()
			return st.Sent == 2000 && st.Received == 2000
		})
		st := nd.tr.Stats()
		if st.Sent != 2000 || st.Received != 2000 || st.Dropped != 0 || st.Discarded != 0 {
			t.Errorf("node %d stats %+v: want 2000 sent and received, nothing dropped", nd.tr.cfg.ID, st)
		}
		if st.Dials != 2 {
			t.Errorf("node %d dialed %d times, want once per peer (2): one long-lived connection per direction", nd.tr.cfg.ID, st.Dials)
		}
	}
	for _, nd := range nodes {
		nd.stop()
	}
}

func TestDirectSendToSelfAndUnknownPeer(t *testing.T) {
	tr := NewDirect(DirectConfig{ID: 1, Group: "g"})
	defer tr.Close()
	if err := tr.Send(Message{Type: MsgHeartbeat, From: 1, To: 1}); err != nil {
		t.Fatalf("send to self: %v", err)
	}
	if m, ok := xportRecvOne(tr, time.Second); !ok || m.To != 1 || m.Group != "g" {
		t.Fatalf("send to self: got %+v, %v", m, ok)
	}
	err := tr.Send(Message{Type: MsgHeartbeat, From: 1, To: 7})
	if err == nil || !strings.Contains(err.Error(), "no address for node 7") {
		t.Fatalf("send to unknown peer: err %v, want 'no address for node 7'", err)
	}
	if err := tr.Send(Message{Type: MsgHeartbeat, Group: "other", To: 1}); err == nil {
		t.Fatal("send of another group's message: want an error")
	}
}

func TestDirectRestartedPeerIsReconnected(t *testing.T) {
	a := directTestStart(t, "g", 1, "")
	b := directTestStart(t, "g", 2, "")
	addr := b.addr
	a.tr.SetPeers([]Peer{{ID: 1, Addr: a.addr}, {ID: 2, Addr: addr}})
	if err := a.tr.Send(Message{Type: MsgPrepare, From: 1, To: 2, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if m, ok := xportRecvOne(b.tr, 5*time.Second); !ok || m.Seq != 1 {
		t.Fatalf("before restart: got %+v, %v", m, ok)
	}
	b.stop()
	b2 := directTestStart(t, "g", 2, addr)
	// Messages sent while the peer was down, or into the dead stream, may
	// be lost; keep sending until one arrives on the new peer.
	var seq uint64 = 100
	deadline := time.Now().Add(10 * time.Second)
	for got := false; !got; {
		if time.Now().After(deadline) {
			t.Fatalf("restarted peer never received a message; sender stats %+v", a.tr.Stats())
		}
		seq++
		_ = a.tr.Send(Message{Type: MsgPrepare, From: 1, To: 2, Seq: seq})
		_, got = xportRecvOne(b2.tr, 50*time.Millisecond)
	}
	for i := 0; i < 100; i++ {
		if err := a.tr.Send(Message{Type: MsgPrepare, From: 1, To: 2, Seq: 1000 + uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 100; {
		m, ok := xportRecvOne(b2.tr, 5*time.Second)
		if !ok {
			t.Fatalf("after restart: got %d of 100 messages", i)
		}
		if m.Seq >= 1000 {
			i++
		}
	}
	if d := a.tr.Stats().Dials; d < 2 {
		t.Fatalf("sender dialed %d times, want a second connection after the restart", d)
	}
}

// directTestWrapped is middleware's ResponseWriter: it hides Hijack but
// unwraps.
type directTestWrapped struct{ http.ResponseWriter }

func (w directTestWrapped) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func TestDirectBehindWrappingMiddleware(t *testing.T) {
	b := NewDirect(DirectConfig{ID: 2, Group: "g"})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.Handler().ServeHTTP(directTestWrapped{w}, r)
	}))
	defer srv.Close()
	defer b.Close()
	a := NewDirect(DirectConfig{ID: 1, Group: "g"})
	defer a.Close()
	a.SetPeers([]Peer{{ID: 2, Addr: srv.Listener.Addr().String()}})
	if err := a.Send(Message{Type: MsgPrepare, From: 1, To: 2, Seq: 7}); err != nil {
		t.Fatal(err)
	}
	if m, ok := xportRecvOne(b, 5*time.Second); !ok || m.Seq != 7 {
		t.Fatalf("through middleware: got %+v, %v (sender stats %+v)", m, ok, a.Stats())
	}
}

// directTestUpgrade sends a raw upgrade request and returns the response
// and the connection.
func directTestUpgrade(t *testing.T, addr, method string, hdr map[string]string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	req, _ := http.NewRequest(method, "http://"+addr+DirectStreamPath, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, c, br
}

func TestDirectRefusesBadUpgrades(t *testing.T) {
	n := directTestStart(t, "g1", 1, "")
	good := map[string]string{"Connection": "Upgrade", "Upgrade": directProtocol, directHeaderGrp: "g1", directHeaderFrom: "2", directHeaderTo: "1"}
	with := func(k, v string) map[string]string {
		h := make(map[string]string, len(good))
		for gk, gv := range good {
			h[gk] = gv
		}
		if v == "" {
			delete(h, k)
		} else {
			h[k] = v
		}
		return h
	}
	cases := []struct {
		name   string
		method string
		hdr    map[string]string
		status int
		body   string
	}{
		{"wrong group", "GET", with(directHeaderGrp, "g2"), 400, `group "g2" refused`},
		{"no group", "GET", with(directHeaderGrp, ""), 400, `group "" refused`},
		{"bad node id", "GET", with(directHeaderFrom, "x"), 400, "numeric"},
		{"meant for another node", "GET", with(directHeaderTo, "3"), 400, "for node 3 reached node 1"},
		{"no upgrade", "GET", with("Upgrade", ""), 426, "Upgrade"},
		{"other protocol", "GET", with("Upgrade", "websocket"), 426, "Upgrade"},
		{"post", "POST", good, 405, "GET"},
		{"accepted", "GET", good, 101, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, _, _ := directTestUpgrade(t, n.addr, tc.method, tc.hdr)
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.body) {
				t.Fatalf("got %d %q, want %d containing %q", resp.StatusCode, body, tc.status, tc.body)
			}
		})
	}
	if r := n.tr.Stats().Refused; r != 7 {
		t.Fatalf("refused %d streams, want 7", r)
	}
}

func TestDirectWrongGroupPeerGetsNothing(t *testing.T) {
	a := directTestStart(t, "g1", 1, "")
	b := directTestStart(t, "g2", 2, "")
	a.tr.SetPeers([]Peer{{ID: 2, Addr: b.addr}})
	xportWaitFor(t, 10*time.Second, "the other group's node to refuse two streams", func() bool {
		_ = a.tr.Send(Message{Type: MsgPrepare, From: 1, To: 2})
		return b.tr.Stats().Refused >= 2 && a.tr.Stats().DialErrors >= 2
	})
	if st := b.tr.Stats(); st.Received != 0 {
		t.Fatalf("node of group g2 received %d messages from group g1", st.Received)
	}
	if st := a.tr.Stats(); st.Dials != 0 {
		t.Fatalf("sender stats %+v: want refused dials only", st)
	}
}

func TestDirectFramesOnTheWire(t *testing.T) {
	n := directTestStart(t, "g", 1, "")
	hdr := map[string]string{"Connection": "Upgrade", "Upgrade": directProtocol, directHeaderGrp: "g", directHeaderFrom: "2"}
	resp, c, br := directTestUpgrade(t, n.addr, "GET", hdr)
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != directProtocol {
		t.Fatalf("upgrade: %s %v", resp.Status, resp.Header)
	}
	frame := func(m Message) ([]byte, []byte) {
		b, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		return binary.BigEndian.AppendUint32(nil, uint32(len(b))), b
	}
	var wire []byte
	for _, m := range []Message{
		{Type: MsgPromise, Group: "g", From: 2, To: 1, Seq: 1},
		{Type: MsgPromise, Group: "other", From: 2, To: 1, Seq: 2}, // other group: dropped
		{Type: MsgPromise, Group: "g", From: 2, To: 5, Seq: 3},     // other node: dropped
		{Type: MsgPromise, Group: "g", From: 2, To: 1, Seq: 4},
	} {
		h, b := frame(m)
		wire = append(append(wire, h...), b...)
	}
	if _, err := c.Write(wire); err != nil {
		t.Fatal(err)
	}
	for _, want := range []uint64{1, 4} {
		if m, ok := xportRecvOne(n.tr, 5*time.Second); !ok || m.Seq != want {
			t.Fatalf("got %+v, %v; want seq %d", m, ok, want)
		}
	}
	if d := n.tr.Stats().Discarded; d != 2 {
		t.Fatalf("discarded %d frames, want 2", d)
	}
	// A frame over the limit closes the stream.
	if _, err := c.Write(binary.BigEndian.AppendUint32(nil, DirectMaxFrame+1)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after an oversized frame: read %v, want EOF (connection closed)", err)
	}
	if r := n.tr.Stats().Refused; r != 1 {
		t.Fatalf("refused %d, want 1 (the oversized frame)", r)
	}
}

func TestDirectBurstIsBatched(t *testing.T) {
	// A peer that holds its 101 answer until 500 messages are queued: the
	// writer then sends them in two flushes (256 frames at most in one).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gate := make(chan struct{})
	got := make(chan []Message, 1)
	go func() {
		var ms []Message
		defer func() { got <- ms }()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil || req.Header.Get(directHeaderGrp) != "g" || req.Header.Get(directHeaderFrom) != "1" || req.Header.Get(directHeaderTo) != "2" {
			t.Errorf("upgrade request: %v %v", err, req)
			return
		}
		<-gate
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+directProtocol+"\r\n\r\n")
		var hdr [4]byte
		for len(ms) < 500 {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				return
			}
			b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(br, b); err != nil {
				return
			}
			m, err := Decode(b)
			if err != nil {
				t.Errorf("frame %d: %v", len(ms), err)
				return
			}
			ms = append(ms, m)
		}
	}()
	tr := NewDirect(DirectConfig{ID: 1, Group: "g"})
	defer tr.Close()
	tr.SetPeers([]Peer{{ID: 2, Addr: ln.Addr().String()}})
	for i := 0; i < 500; i++ {
		if err := tr.Send(Message{Type: MsgAccept, From: 1, To: 2, Slot: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	close(gate)
	ms := <-got
	if len(ms) != 500 {
		t.Fatalf("peer read %d frames, want 500", len(ms))
	}
	for i, m := range ms {
		if m.Slot != uint64(i) || m.Group != "g" || m.To != 2 {
			t.Fatalf("frame %d: %+v", i, m)
		}
	}
	xportWaitFor(t, 5*time.Second, "the last flush counted", func() bool { return tr.Stats().Sent == 500 })
	if st := tr.Stats(); st.Flushes > 2 {
		t.Fatalf("stats %+v: want 500 sent in at most 2 flushes", st)
	}
}

func TestDirectSendNeverBlocks(t *testing.T) {
	// A peer that accepts TCP connections and never answers: the dialer
	// hangs in the handshake while Send keeps queueing, then dropping.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		for _, c := range held {
			_ = c.Close()
		}
		mu.Unlock()
	}()
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tr := NewDirect(DirectConfig{ID: 1, Group: "g"})
	tr.SetPeers([]Peer{{ID: 2, Addr: ln.Addr().String()}})
	start := time.Now()
	var refused int
	for i := 0; i < 3000; i++ {
		if tr.Send(Message{Type: MsgAccept, From: 1, To: 2, Slot: uint64(i)}) != nil {
			refused++
		}
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("3000 sends to a stuck peer took %v", el)
	}
	if refused < 3000-directQueue-1 || tr.Stats().Dropped != uint64(refused) {
		t.Fatalf("refused %d sends (stats %+v), want about %d", refused, tr.Stats(), 3000-directQueue-1)
	}
	start = time.Now()
	_ = tr.Close()
	if el := time.Since(start); el > time.Second {
		t.Fatalf("Close with a dial in its handshake took %v", el)
	}
}

func TestDirectCloseEndsEverything(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	nodes, trs, ids := directTestGroup(t, "g", 2)
	xportExchange(t, trs, ids, "g", 10)
	// A peer nobody listens for: its writer sits in dial backoff.
	nodes[0].tr.SetPeers([]Peer{{ID: 2, Addr: nodes[1].addr}, {ID: 3, Addr: "127.0.0.1:1"}})
	_ = nodes[0].tr.Send(Message{Type: MsgAccept, From: 1, To: 3})
	xportWaitFor(t, 5*time.Second, "a failed dial", func() bool { return nodes[0].tr.Stats().DialErrors > 0 })
	// Close the listening side first: its accepted stream is hijacked, so
	// only the transport can close it.
	for _, i := range []int{1, 0} {
		for k := 0; k < 2; k++ {
			if err := nodes[i].tr.Close(); err != nil {
				t.Fatalf("close #%d: %v", k+1, err)
			}
		}
		if _, ok := <-nodes[i].tr.Recv(); ok {
			t.Fatal("Recv still open after Close")
		}
		if err := nodes[i].tr.Send(Message{Type: MsgAccept, To: ids[1-i]}); err == nil {
			t.Fatal("Send after Close: want an error")
		}
		nodes[i].srv.Close()
	}
}

// directBenchPair starts two direct transports that know each other.
func directBenchPair(b *testing.B) (Transport, Transport) {
	b.Helper()
	var trs [2]*DirectTransport
	var peers []Peer
	for i := range trs {
		trs[i] = NewDirect(DirectConfig{ID: NodeID(i + 1), Group: "bench"})
		mux := http.NewServeMux()
		mux.Handle(DirectStreamPath, trs[i].Handler())
		srv := httptest.NewServer(mux)
		tr := trs[i]
		b.Cleanup(func() { _ = tr.Close(); srv.Close() })
		peers = append(peers, Peer{ID: NodeID(i + 1), Addr: srv.Listener.Addr().String()})
	}
	for _, tr := range trs {
		tr.SetPeers(peers)
	}
	return trs[0], trs[1]
}
