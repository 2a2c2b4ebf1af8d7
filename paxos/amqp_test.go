package paxos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"
)

// These tests run against the RabbitMQ on 127.0.0.1:5672 (or
// DROVER_RABBITMQ_URL). They skip when it is unreachable, unless
// DROVER_REQUIRE_SERVICES=1. Each test uses a group of its own, so its
// routing keys are its own.

func amqpTestURL() string {
	if u := os.Getenv("DROVER_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func amqpTestGroup(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
	return fmt.Sprintf("t-%s-%d", name, time.Now().UnixNano())
}

func amqpTestDial(t testing.TB, group string, id NodeID) *AMQPTransport {
	t.Helper()
	return amqpTestDialConfig(t, AMQPConfig{URL: amqpTestURL(), Group: group, ID: id})
}

func amqpTestDialConfig(t testing.TB, cfg AMQPConfig) *AMQPTransport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg.Logger = xportTestLogger(t)
	tr, err := DialAMQP(ctx, cfg)
	if err != nil {
		if errors.Is(err, ErrBrokerUnreachable) && os.Getenv("DROVER_REQUIRE_SERVICES") != "1" {
			t.Skipf("RabbitMQ not available: %v", err)
		}
		t.Fatalf("dial node %d: %v", cfg.ID, err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func TestAMQPPointToPointManyMessages(t *testing.T) {
	group := amqpTestGroup(t)
	trs := []*AMQPTransport{amqpTestDial(t, group, 1), amqpTestDial(t, group, 2), amqpTestDial(t, group, 3)}
	xportExchange(t, []Transport{trs[0], trs[1], trs[2]}, []NodeID{1, 2, 3}, group, 1000)
	for i, tr := range trs {
		xportWaitFor(t, 10*time.Second, "every publish confirmed and counted", func() bool {
			st := tr.Stats()
			return st.Confirmed == 2000 && st.Received == 2000
		})
		st := tr.Stats()
		if st.Sent != 2000 || st.Received != 2000 || st.Nacked != 0 || st.Dropped != 0 || st.Returned != 0 {
			t.Errorf("node %d stats %+v: want 2000 sent, confirmed and received; nothing nacked, dropped or returned", i+1, st)
		}
		// Routing keys per node: nothing addressed elsewhere reached it.
		if st.Discarded != 0 {
			t.Errorf("node %d was delivered %d messages for other nodes", i+1, st.Discarded)
		}
	}
}

func TestAMQPGroupIsolation(t *testing.T) {
	g1, g2 := amqpTestGroup(t)+"-a", amqpTestGroup(t)+"-b"
	a1, a2 := amqpTestDial(t, g1, 1), amqpTestDial(t, g1, 2)
	b1, b2 := amqpTestDial(t, g2, 1), amqpTestDial(t, g2, 2)
	for i := 1; i <= 100; i++ {
		if err := a1.Send(Message{Type: MsgPrepare, From: 1, To: 2, Seq: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 100; i++ {
		if m, ok := xportRecvOne(a2, 10*time.Second); !ok || m.Group != g1 {
			t.Fatalf("group %s node 2: message %d: %+v, %v", g1, i, m, ok)
		}
	}
	// The other group's node 2 gets its own marker and nothing else.
	if err := b1.Send(Message{Type: MsgPrepare, From: 1, To: 2, Seq: 999}); err != nil {
		t.Fatal(err)
	}
	if m, ok := xportRecvOne(b2, 10*time.Second); !ok || m.Group != g2 || m.Seq != 999 {
		t.Fatalf("group %s node 2 got %+v, %v; want only its own group's marker", g2, m, ok)
	}
	xportWaitFor(t, 5*time.Second, "the marker counted", func() bool { return b2.Stats().Received >= 1 })
	if st := b2.Stats(); st.Received != 1 || st.Discarded != 0 {
		t.Fatalf("group %s node 2 stats %+v: want exactly one message", g2, st)
	}

	// Messages that reach the queue but name another group, or are not
	// messages at all, are dropped and counted.
	conn, err := amqp.Dial(amqpTestURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := Encode(Message{Type: MsgPrepare, Group: "intruder", From: 1, To: 2})
	for _, body := range [][]byte{foreign, []byte("not a message")} {
		if err := ch.Publish(DefaultAMQPExchange, amqpRoutingKey(g1, 2), false, false, amqp.Publishing{Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	xportWaitFor(t, 10*time.Second, "two foreign deliveries discarded", func() bool { return a2.Stats().Discarded == 2 })
	if err := a1.Send(Message{Type: MsgPrepare, From: 1, To: 2, Seq: 1000}); err != nil {
		t.Fatal(err)
	}
	if m, ok := xportRecvOne(a2, 10*time.Second); !ok || m.Seq != 1000 || m.Group != g1 {
		t.Fatalf("after foreign deliveries: got %+v, %v; want the marker", m, ok)
	}
}

func TestAMQPDuplicateNodeRefused(t *testing.T) {
	group := amqpTestGroup(t)
	amqpTestDial(t, group, 1)
	_, err := DialAMQP(context.Background(), AMQPConfig{URL: amqpTestURL(), Group: group, ID: 1})
	if err == nil || !strings.Contains(err.Error(), "is another node running as node 1") {
		t.Fatalf("second node 1 of the group: %v; want it refused as a duplicate", err)
	}
}

func TestAMQPCloseIsIdempotentAndEndsGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	group := amqpTestGroup(t)
	a, b := amqpTestDial(t, group, 1), amqpTestDial(t, group, 2)
	xportExchange(t, []Transport{a, b}, []NodeID{1, 2}, group, 10)
	// Messages queued for an absent node are returned by the broker.
	if err := a.Send(Message{Type: MsgPrepare, From: 1, To: 9}); err != nil {
		t.Fatal(err)
	}
	xportWaitFor(t, 10*time.Second, "a publish to an absent node returned", func() bool { return a.Stats().Returned == 1 })
	for _, tr := range []*AMQPTransport{a, b} {
		for k := 0; k < 2; k++ {
			if err := tr.Close(); err != nil {
				t.Fatalf("close #%d: %v", k+1, err)
			}
		}
		if _, ok := <-tr.Recv(); ok {
			t.Fatal("Recv still open after Close")
		}
		if err := tr.Send(Message{Type: MsgPrepare, To: 1}); err == nil {
			t.Fatal("Send after Close: want an error")
		}
		if tr.Stats().Connected {
			t.Fatal("Stats says connected after Close")
		}
	}
}

// amqpTestSession waits for tr to have a live session and returns it.
func amqpTestSession(t *testing.T, tr *AMQPTransport) *amqpSession {
	t.Helper()
	var s *amqpSession
	xportWaitFor(t, 15*time.Second, "a broker session", func() bool {
		s = tr.current.Load()
		return s != nil
	})
	return s
}

// amqpTestResumes sends from -> to until a message arrives, then checks a
// further 200 all arrive.
func amqpTestResumes(t *testing.T, from, to *AMQPTransport, fromID, toID NodeID) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for seq := uint64(1); ; seq++ {
		if time.Now().After(deadline) {
			t.Fatalf("node %d -> %d: delivery did not resume; stats %+v / %+v", fromID, toID, from.Stats(), to.Stats())
		}
		_ = from.Send(Message{Type: MsgHeartbeat, From: fromID, To: toID, Seq: seq})
		if _, ok := xportRecvOne(to, 100*time.Millisecond); ok {
			break
		}
	}
	for i := 0; i < 200; i++ {
		if err := from.Send(Message{Type: MsgHeartbeat, From: fromID, To: toID, Seq: 1_000_000 + uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 200; {
		m, ok := xportRecvOne(to, 10*time.Second)
		if !ok {
			t.Fatalf("node %d -> %d: %d of 200 messages after the reconnect", fromID, toID, got)
		}
		if m.Seq >= 1_000_000 {
			got++
		}
	}
}

func TestAMQPReconnects(t *testing.T) {
	cuts := []struct {
		name string
		cut  func(t *testing.T, s *amqpSession)
	}{
		{"server closes the connection", amqpTestServerClose},
		{"network cut", func(t *testing.T, s *amqpSession) { _ = s.raw.Close() }},
	}
	for _, tc := range cuts {
		t.Run(tc.name, func(t *testing.T) {
			group := amqpTestGroup(t)
			a, b := amqpTestDial(t, group, 1), amqpTestDial(t, group, 2)
			amqpTestResumes(t, a, b, 1, 2)
			old := amqpTestSession(t, b)
			tc.cut(t, old)
			xportWaitFor(t, 15*time.Second, "node 2 reconnected", func() bool {
				st := b.Stats()
				return st.Reconnects == 1 && st.Connected
			})
			if s := amqpTestSession(t, b); s == old {
				t.Fatal("node 2 still on its old session")
			}
			amqpTestResumes(t, a, b, 1, 2) // its queue and binding are back
			amqpTestResumes(t, b, a, 2, 1) // its publisher works again
		})
	}
}

// amqpTestServerClose has the broker close s's connection (only that
// one: other tests may share the broker).
func amqpTestServerClose(t *testing.T, s *amqpSession) {
	name := s.conn.LocalAddr().String() + " -> " + s.conn.RemoteAddr().String()
	out, err := exec.Command("rabbitmqctl", "list_connections", "-q", "--no-table-headers", "pid", "name").CombinedOutput()
	if err != nil {
		t.Skipf("rabbitmqctl list_connections unavailable (%v: %s); the network cut case covers reconnects", err, out)
	}
	pid := ""
	for _, line := range strings.Split(string(out), "\n") {
		if p, n, ok := strings.Cut(line, "\t"); ok && strings.TrimSpace(n) == name {
			pid = p
		}
	}
	if pid == "" {
		t.Fatalf("connection %q not in rabbitmqctl list_connections:\n%s", name, out)
	}
	if out, err := exec.Command("rabbitmqctl", "close_connection", pid, "drover test: forced close").CombinedOutput(); err != nil {
		t.Skipf("rabbitmqctl close_connection failed (%v: %s); the network cut case covers reconnects", err, out)
	}
}

// amqpTestProxy forwards TCP connections to the broker; stopping it is a
// broker outage for whoever dialed through it, and nobody else.
type amqpTestProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func amqpTestStartProxy(t *testing.T, addr string) *amqpTestProxy {
	t.Helper()
	u, err := url.Parse(amqpTestURL())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &amqpTestProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", u.Host)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(b, c); _ = b.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, b); _ = c.Close() }()
		}
	}()
	t.Cleanup(p.stop)
	return p
}

// url is the test broker's URL with the proxy as host.
func (p *amqpTestProxy) url() string {
	u, _ := url.Parse(amqpTestURL())
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *amqpTestProxy) stop() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func TestAMQPBrokerOutage(t *testing.T) {
	// The broker "restarts": connections drop, dials fail for a while,
	// and the exchange is gone when it is back (it is not durable).
	group, exchange := amqpTestGroup(t), amqpTestGroup(t)+"-x"
	proxy := amqpTestStartProxy(t, "127.0.0.1:0")
	a := amqpTestDialConfig(t, AMQPConfig{URL: amqpTestURL(), Exchange: exchange, Group: group, ID: 1})
	b := amqpTestDialConfig(t, AMQPConfig{URL: proxy.url(), Exchange: exchange, Group: group, ID: 2})
	amqpTestResumes(t, a, b, 1, 2)
	addr := proxy.ln.Addr().String()
	proxy.stop()
	xportWaitFor(t, 15*time.Second, "failed reconnects while the broker is away", func() bool {
		st := b.Stats()
		return !st.Connected && st.ReconnectErrors >= 2
	})
	conn, err := amqp.Dial(amqpTestURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the nodes declared it again
		if c, err := amqp.Dial(amqpTestURL()); err == nil {
			if ch, err := c.Channel(); err == nil {
				_ = ch.ExchangeDelete(exchange, false, false)
			}
			_ = c.Close()
		}
	})
	// Node 1's publishes now fail (no exchange): it reconnects too, and
	// redeclares the exchange.
	_ = a.Send(Message{Type: MsgHeartbeat, From: 1, To: 2})
	amqpTestStartProxy(t, addr)
	xportWaitFor(t, 15*time.Second, "node 2 back", func() bool { return b.Stats().Connected && b.Stats().Reconnects == 1 })
	amqpTestResumes(t, a, b, 1, 2)
	amqpTestResumes(t, b, a, 2, 1)
}

func TestAMQPDialErrors(t *testing.T) {
	ctx := context.Background()
	_, err := DialAMQP(ctx, AMQPConfig{URL: "amqp://guest:s3cret@127.0.0.1:1/", ID: 1})
	if err == nil {
		t.Fatal("dial 127.0.0.1:1: no error")
	}
	msg := err.Error()
	if !errors.Is(err, ErrBrokerUnreachable) || !strings.Contains(msg, "amqp://guest:xxxxx@127.0.0.1:1/") ||
		strings.Contains(msg, "s3cret") || !strings.Contains(msg, "check that the broker is running") {
		t.Fatalf("unreachable broker: %q; want ErrBrokerUnreachable naming the URL without its password and what to check", msg)
	}

	// Rejected credentials: the same kind of error, password still hidden.
	u, _ := url.Parse(amqpTestURL())
	u.User = url.UserPassword(u.User.Username(), "wr0ng-pw")
	_, err = DialAMQP(ctx, AMQPConfig{URL: u.String(), ID: 1})
	if err == nil || !errors.Is(err, ErrBrokerUnreachable) || strings.Contains(err.Error(), "wr0ng-pw") {
		t.Fatalf("wrong password: %v; want ErrBrokerUnreachable without the password", err)
	}

	// A listener that never speaks AMQP: ctx ends the handshake.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = DialAMQP(tctx, AMQPConfig{URL: "amqp://guest:guest@" + ln.Addr().String() + "/", ID: 1})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrBrokerUnreachable) || time.Since(start) > 3*time.Second {
		t.Fatalf("silent broker with a 300ms context: err %v after %v; want the context's deadline, promptly", err, time.Since(start))
	}

	for _, tc := range []struct{ name, url, group, want string }{
		{"no URL", "", "", "URL is empty"},
		{"other scheme", "http://127.0.0.1:5672/", "", "bad URL"},
		{"wildcard group", "amqp://127.0.0.1/", "a.*", "may not contain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DialAMQP(ctx, AMQPConfig{URL: tc.url, Group: tc.group})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// BenchmarkTransportRoundTrip measures a request and its reply between
// two nodes (ns/op is the round trip), and a burst of 64 requests
// answered by 64 replies (msgs/s counts requests).
func BenchmarkTransportRoundTrip(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		a, peer := directBenchPair(b)
		xportBenchRoundTrip(b, a, peer)
	})
	b.Run("amqp", func(b *testing.B) {
		group := amqpTestGroup(b)
		a := amqpTestDial(b, group, 1)
		peer := amqpTestDial(b, group, 2)
		xportBenchRoundTrip(b, a, peer)
	})
}

func xportBenchRoundTrip(b *testing.B, a, peer Transport) {
	go func() { // ends when peer's Recv closes
		for m := range peer.Recv() {
			m.From, m.To, m.Type = m.To, m.From, MsgAccepted
			_ = peer.Send(m)
		}
	}()
	req := Message{Type: MsgAccept, From: 1, To: 2, Entries: []Entry{{Slot: 1, Cmd: Command{Op: OpAcquire, Lock: "l", Owner: "o", TTL: 1000}}}}
	roundTrips := func(b *testing.B, n int) {
		for i := 0; i < n; i++ {
			if err := a.Send(req); err != nil {
				b.Fatal(err)
			}
		}
		for i := 0; i < n; i++ {
			if _, ok := xportRecvOne(a, 10*time.Second); !ok {
				b.Fatalf("reply %d of %d lost", i+1, n)
			}
		}
	}
	roundTrips(b, 1) // connects, and warms up
	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			roundTrips(b, 1)
		}
	})
	b.Run("burst64", func(b *testing.B) {
		for b.Loop() {
			roundTrips(b, 64)
		}
		b.ReportMetric(float64(64*b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}
