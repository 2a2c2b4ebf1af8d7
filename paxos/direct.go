package paxos

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DirectStreamPath is where the node's HTTP server mounts
// DirectTransport.Handler.
const DirectStreamPath = "/paxos/v1/stream"

// The upgrade handshake: the dialer names the protocol, its group, itself
// and the node it means to reach.
const (
	directProtocol   = "drover-paxos"
	directHeaderGrp  = "Drover-Paxos-Group"
	directHeaderFrom = "Drover-Paxos-Node"
	directHeaderTo   = "Drover-Paxos-To"
)

// Tuning of the direct transport.
const (
	// DirectMaxFrame is the largest frame (one encoded message) a stream
	// accepts; a larger one closes the connection.
	DirectMaxFrame   = 64 << 20
	directQueue      = 1024    // messages waiting for one peer; past it Send drops
	directBatch      = 256     // frames written before one flush, at most
	directRecvBuffer = 1024    // capacity of Recv
	directKeepBuffer = 1 << 20 // largest read buffer a stream keeps between frames

	directDialTimeout  = 5 * time.Second
	directWriteTimeout = 10 * time.Second
	directBackoffMin   = 20 * time.Millisecond
	directBackoffMax   = 2 * time.Second
)

var errDirectClosed = errors.New("paxos: direct transport closed")

// DirectConfig configures a direct transport. Zero values take defaults.
type DirectConfig struct {
	// ID is this node.
	ID NodeID
	// Group names the Paxos group; streams from another group are
	// refused. Default "drover".
	Group string
	// Logger receives connection events. Default: discard.
	Logger *slog.Logger
}

// DirectStats counts what a direct transport did since it was made.
// Dropped messages were not sent: the peer's queue was full, its dial
// failed, its connection broke under them, or Close came first.
// Discarded frames were undecodable, of another group, or for another
// node. Refused streams had a bad handshake, the wrong group or an
// oversized frame.
type DirectStats struct {
	Sent       uint64 `json:"sent"`        // written and flushed to a peer
	Flushes    uint64 `json:"flushes"`     // batches written: Sent/Flushes per syscall
	Dropped    uint64 `json:"dropped"`     // not sent
	Received   uint64 `json:"received"`    // handed to Recv
	Discarded  uint64 `json:"discarded"`   // frames dropped on arrival
	Dials      uint64 `json:"dials"`       // connections set up to peers
	DialErrors uint64 `json:"dial_errors"` // failed dials, refused upgrades included
	Refused    uint64 `json:"refused"`     // incoming streams refused or cut
}

// DirectTransport carries a group's messages over plain TCP connections
// between the nodes' HTTP listeners. A node dials each peer lazily, on the
// first message for it, with an HTTP/1.1 upgrade to "drover-paxos" at
// DirectStreamPath; after 101 Switching Protocols the connection carries
// frames one way, dialer to listener: a 4-byte big-endian length and the
// Encode'd message. So each ordered pair of nodes has one long-lived
// connection per direction.
//
// Each peer has a bounded queue (Send drops when it is full, never
// blocks) and one writer goroutine that writes everything queued through
// a bufio.Writer and flushes once the queue is drained: a burst costs one
// syscall. TCP_NODELAY is on. A broken connection is dialed again on the
// next message, with a jittered backoff after failed dials.
type DirectTransport struct {
	cfg  DirectConfig
	log  *slog.Logger
	recv chan Message

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	mu     sync.RWMutex
	closed bool
	peers  map[NodeID]*directPeer
	conns  map[net.Conn]struct{} // accepted streams
	// former are the addresses of peers SetPeers dropped, by id: a member
	// still answers a removed node (see Send).
	former map[NodeID]string

	sent, dropped, received, discarded  atomic.Uint64
	dials, dialErrors, refused, flushes atomic.Uint64
}

// directPeer is the dialing side towards one peer.
type directPeer struct {
	id     NodeID
	addr   string
	queue  chan []byte
	ctx    context.Context
	cancel context.CancelFunc
}

// NewDirect makes a direct transport. It starts nothing: dialers start
// with SetPeers, readers when peers connect to Handler.
func NewDirect(cfg DirectConfig) *DirectTransport {
	if cfg.Group == "" {
		cfg.Group = "drover"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &DirectTransport{
		cfg:    cfg,
		log:    cfg.Logger.With("transport", "direct", "group", cfg.Group, "node", uint64(cfg.ID)),
		recv:   make(chan Message, directRecvBuffer),
		peers:  make(map[NodeID]*directPeer),
		conns:  make(map[net.Conn]struct{}),
		former: make(map[NodeID]string),
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t
}

// Send queues m for node m.To and returns at once; a message to this node
// itself goes straight to Recv. It stamps m.Group when empty. A node
// SetPeers dropped is still reached at its last address: a removed node
// that has not learned so campaigns, and a member's answer (how far the
// log is, and the entries) is how it learns. A peer without an address or
// with a full queue costs the message (counted), and the error says which.
func (t *DirectTransport) Send(m Message) error {
	if m.Group == "" {
		m.Group = t.cfg.Group
	} else if m.Group != t.cfg.Group {
		return fmt.Errorf("paxos: direct send %s: message of group %q on a transport of group %q", m.Type, m.Group, t.cfg.Group)
	}
	if m.To == t.cfg.ID {
		return t.loopback(m)
	}
	b, err := Encode(m)
	if err != nil {
		return err
	}
	if len(b) > DirectMaxFrame {
		t.dropped.Add(1)
		return fmt.Errorf("paxos: direct send %s to node %d: %d bytes is over the %d-byte frame limit", m.Type, m.To, len(b), DirectMaxFrame)
	}
	t.mu.RLock()
	p, closed := t.peers[m.To], t.closed
	t.mu.RUnlock()
	if closed {
		return errDirectClosed
	}
	if p == nil {
		if p = t.formerPeer(m.To); p == nil {
			t.dropped.Add(1)
			return fmt.Errorf("paxos: direct send %s: no address for node %d", m.Type, m.To)
		}
	}
	select {
	case p.queue <- b:
		return nil
	default:
		t.dropped.Add(1)
		return fmt.Errorf("paxos: direct send %s to node %d: queue full (%d), message dropped", m.Type, m.To, directQueue)
	}
}

// formerPeer starts a writer towards a node SetPeers dropped, at its last
// address (nil when there is none, or after Close). The next SetPeers
// stops it again.
func (t *DirectTransport) formerPeer(id NodeID) *directPeer {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	if p := t.peers[id]; p != nil {
		return p
	}
	addr, ok := t.former[id]
	if !ok {
		return nil
	}
	return t.startPeer(id, addr)
}

// startPeer starts the writer towards id at addr. t.mu is held.
func (t *DirectTransport) startPeer(id NodeID, addr string) *directPeer {
	ctx, cancel := context.WithCancel(t.ctx)
	p := &directPeer{id: id, addr: addr, queue: make(chan []byte, directQueue), ctx: ctx, cancel: cancel}
	t.peers[id] = p
	t.wg.Add(1)
	go t.runPeer(p)
	return p
}

func (t *DirectTransport) loopback(m Message) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return errDirectClosed
	}
	select {
	case t.recv <- m:
		t.received.Add(1)
		return nil
	default:
		t.dropped.Add(1)
		return fmt.Errorf("paxos: direct send %s to self: receive buffer full, message dropped", m.Type)
	}
}

// Recv is the stream of messages addressed to this node, from every
// peer's connection. Only Close closes it.
func (t *DirectTransport) Recv() <-chan Message { return t.recv }

// SetPeers sets the addresses (host:port of each peer's HTTP listener) to
// dial. A peer whose address changed is dialed anew; a peer no longer
// listed has its writer stopped and its queue dropped, but its address is
// kept (up to directFormer of them), so Send still reaches it. Peers
// without an address, and this node, are skipped.
func (t *DirectTransport) SetPeers(peers []Peer) {
	want := make(map[NodeID]string, len(peers))
	for _, p := range peers {
		if p.ID != t.cfg.ID && p.Addr != "" {
			want[p.ID] = directHostPort(p.Addr)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	for id, p := range t.peers {
		if addr, ok := want[id]; !ok || addr != p.addr {
			p.cancel()
			delete(t.peers, id)
			if !ok {
				t.forget(id, p.addr)
			}
		}
	}
	for id, addr := range want {
		delete(t.former, id)
		if t.peers[id] == nil {
			t.startPeer(id, addr)
		}
	}
}

// directFormer bounds the addresses kept of peers that left.
const directFormer = 64

// forget records the address of a peer that left. t.mu is held.
func (t *DirectTransport) forget(id NodeID, addr string) {
	if _, ok := t.former[id]; !ok && len(t.former) >= directFormer {
		for old := range t.former {
			delete(t.former, old) // any one: membership changes are rare
			break
		}
	}
	t.former[id] = addr
}

// directHostPort accepts host:port, or a URL whose host:port it takes.
func directHostPort(addr string) string {
	if strings.Contains(addr, "://") {
		if u, err := url.Parse(addr); err == nil && u.Host != "" {
			return u.Host
		}
	}
	return addr
}

// Close stops the transport in this order: no new streams or dials; every
// peer's writer is cancelled (its connection closed, queued messages
// dropped); every accepted stream is closed; then it waits for all the
// writer, watcher and reader goroutines to end, and only then closes Recv.
// Safe to call more than once.
func (t *DirectTransport) Close() error {
	t.once.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.cancel()
		for c := range t.conns {
			_ = c.Close()
		}
		t.mu.Unlock()
		t.wg.Wait()
		close(t.recv)
	})
	return nil
}

// Stats returns the transport's counters.
func (t *DirectTransport) Stats() DirectStats {
	return DirectStats{
		Sent: t.sent.Load(), Dropped: t.dropped.Load(), Received: t.received.Load(),
		Discarded: t.discarded.Load(), Dials: t.dials.Load(), DialErrors: t.dialErrors.Load(),
		Refused: t.refused.Load(), Flushes: t.flushes.Load(),
	}
}

// runPeer is one peer's writer: it waits for a message, dials, writes
// until the connection breaks, and starts over, until the peer is dropped
// or the transport closed.
func (t *DirectTransport) runPeer(p *directPeer) {
	defer t.wg.Done()
	defer t.drain(p)
	delay, failures := directBackoffMin, 0
	for p.ctx.Err() == nil {
		var first []byte
		select {
		case first = <-p.queue:
		case <-p.ctx.Done():
			return
		}
		conn, br, err := t.dial(p)
		if err != nil {
			t.dropped.Add(1)
			t.dialErrors.Add(1)
			level := slog.LevelDebug // a peer down for long is not logged every try
			if failures++; failures%30 == 1 && p.ctx.Err() == nil {
				level = slog.LevelWarn
			}
			t.log.Log(p.ctx, level, "paxos: dial peer failed", "peer", uint64(p.id), "addr", p.addr, "failures", failures, "err", err)
			redialSleep(p.ctx, redialJitter(delay))
			delay = min(2*delay, directBackoffMax)
			continue
		}
		delay, failures = directBackoffMin, 0
		t.dials.Add(1)
		t.stream(p, conn, br, first)
	}
}

// drain counts what is left in a stopped peer's queue as dropped.
func (t *DirectTransport) drain(p *directPeer) {
	for i := 0; i < directQueue; i++ {
		select {
		case <-p.queue:
			t.dropped.Add(1)
		default:
			return
		}
	}
}

// dial connects to p and performs the upgrade handshake. The returned
// reader holds whatever the peer sent after its 101 response.
func (t *DirectTransport) dial(p *directPeer) (net.Conn, *bufio.Reader, error) {
	d := net.Dialer{Timeout: directDialTimeout, KeepAlive: 15 * time.Second}
	conn, err := d.DialContext(p.ctx, "tcp", p.addr)
	if err != nil {
		return nil, nil, fmt.Errorf("paxos: dial node %d at %s: %w", p.id, p.addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	stop := context.AfterFunc(p.ctx, func() { _ = conn.Close() })
	br, err := t.handshake(p, conn)
	if !stop() && err == nil {
		err = p.ctx.Err()
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, br, nil
}

func (t *DirectTransport) handshake(p *directPeer, conn net.Conn) (*bufio.Reader, error) {
	_ = conn.SetDeadline(time.Now().Add(directDialTimeout))
	req, err := http.NewRequest(http.MethodGet, "http://"+p.addr+DirectStreamPath, nil)
	if err != nil {
		return nil, fmt.Errorf("paxos: dial node %d: bad address %q: %w", p.id, p.addr, err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", directProtocol)
	req.Header.Set(directHeaderGrp, t.cfg.Group)
	req.Header.Set(directHeaderFrom, strconv.FormatUint(uint64(t.cfg.ID), 10))
	req.Header.Set(directHeaderTo, strconv.FormatUint(uint64(p.id), 10))
	if err := req.Write(conn); err != nil {
		return nil, fmt.Errorf("paxos: dial node %d at %s: send upgrade: %w", p.id, p.addr, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("paxos: dial node %d at %s: read upgrade response: %w", p.id, p.addr, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_ = resp.Body.Close()
		return nil, fmt.Errorf("paxos: dial node %d at %s: upgrade refused: %s: %s", p.id, p.addr, resp.Status, strings.TrimSpace(string(body)))
	}
	_ = conn.SetDeadline(time.Time{})
	return br, nil
}

// stream writes p's queue to conn until the connection breaks or p stops.
// A watcher reads from conn, so a peer that went away is noticed before
// the next write rather than after it.
func (t *DirectTransport) stream(p *directPeer, conn net.Conn, br *bufio.Reader, first []byte) {
	gone := make(chan struct{})
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer close(gone)
		_, _ = io.Copy(io.Discard, br)
	}()
	stop := context.AfterFunc(p.ctx, func() { _ = conn.Close() })
	defer func() {
		stop()
		_ = conn.Close()
		<-gone
	}()
	bw := bufio.NewWriterSize(conn, 64<<10)
	next := first
	for {
		if err := t.writeBatch(conn, bw, p, next); err != nil {
			if p.ctx.Err() == nil {
				t.log.Warn("paxos: write to peer failed", "peer", uint64(p.id), "addr", p.addr, "err", err)
			}
			return
		}
		select {
		case next = <-p.queue:
		case <-gone:
			t.log.Info("paxos: peer closed its stream", "peer", uint64(p.id), "addr", p.addr)
			return
		case <-p.ctx.Done():
			return
		}
	}
}

// writeBatch writes first and whatever else is queued (up to directBatch
// frames), then flushes once.
func (t *DirectTransport) writeBatch(conn net.Conn, bw *bufio.Writer, p *directPeer, first []byte) error {
	_ = conn.SetWriteDeadline(time.Now().Add(directWriteTimeout))
	n := uint64(1)
	err := directWriteFrame(bw, first)
	for more := true; more && err == nil && n < directBatch; {
		select {
		case b := <-p.queue:
			n++
			err = directWriteFrame(bw, b)
		default:
			more = false
		}
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		t.dropped.Add(n)
		return err
	}
	t.sent.Add(n)
	t.flushes.Add(1)
	return nil
}

func directWriteFrame(w *bufio.Writer, b []byte) error {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

// redialSleep waits d or until ctx ends; it reports whether d passed.
func redialSleep(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// redialJitter spreads d over [d/2, d) so reconnecting nodes do not dial
// in step.
func redialJitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}
