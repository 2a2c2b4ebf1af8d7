package paxos

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The listening side of the direct transport: peers' streams, upgraded
// from HTTP at DirectStreamPath, read into Recv.

// Handler serves peers' streams; mount it at DirectStreamPath. It answers
// 405 to a method other than GET, 426 without the upgrade headers, 400
// to another group, a bad node id or a stream meant for another node, and
// 503 after Close; otherwise it hijacks the connection, answers 101 and
// reads frames until the peer or Close ends it.
func (t *DirectTransport) Handler() http.Handler { return http.HandlerFunc(t.serveStream) }

func (t *DirectTransport) serveStream(w http.ResponseWriter, r *http.Request) {
	from, status, msg := t.checkUpgrade(r)
	if status != 0 {
		t.refused.Add(1)
		t.log.Warn("paxos: stream refused", "remote", r.RemoteAddr, "status", status, "reason", msg)
		if status == http.StatusUpgradeRequired {
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", directProtocol)
		}
		http.Error(w, msg, status)
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		http.Error(w, "paxos: node is shutting down", http.StatusServiceUnavailable)
		return
	}
	t.wg.Add(1)
	t.mu.Unlock()
	defer t.wg.Done()
	// The controller finds the connection behind middleware that wraps
	// the ResponseWriter (through Unwrap).
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.log.Warn("paxos: cannot take over the stream's connection", "remote", r.RemoteAddr, "err", err)
		http.Error(w, "paxos: this server cannot hand over connections (HTTP/1.1 required)", http.StatusInternalServerError)
		return
	}
	if !t.trackConn(conn) {
		_ = conn.Close()
		return
	}
	defer t.untrackConn(conn)
	_ = conn.SetDeadline(time.Time{})
	_, err = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + directProtocol + "\r\n\r\n")
	if err == nil {
		err = brw.Flush()
	}
	if err != nil {
		return
	}
	t.log.Debug("paxos: peer stream open", "peer", from, "remote", r.RemoteAddr)
	t.readFrames(brw.Reader, from)
}

// checkUpgrade validates an upgrade request. A zero status means
// accept.
func (t *DirectTransport) checkUpgrade(r *http.Request) (from uint64, status int, msg string) {
	if r.Method != http.MethodGet {
		return 0, http.StatusMethodNotAllowed, "paxos: stream wants GET with an upgrade to " + directProtocol
	}
	if !directHasToken(r.Header, "Connection", "upgrade") || !directHasToken(r.Header, "Upgrade", directProtocol) {
		return 0, http.StatusUpgradeRequired, "paxos: stream wants Connection: Upgrade and Upgrade: " + directProtocol
	}
	if g := r.Header.Get(directHeaderGrp); g != t.cfg.Group {
		return 0, http.StatusBadRequest, fmt.Sprintf("paxos: stream of group %q refused: this node is in group %q", g, t.cfg.Group)
	}
	from, err := strconv.ParseUint(r.Header.Get(directHeaderFrom), 10, 64)
	if err != nil {
		return 0, http.StatusBadRequest, "paxos: stream wants a numeric " + directHeaderFrom + " header"
	}
	if to := r.Header.Get(directHeaderTo); to != "" && to != strconv.FormatUint(uint64(t.cfg.ID), 10) {
		return 0, http.StatusBadRequest, fmt.Sprintf("paxos: stream for node %s reached node %d: check the peer addresses", to, t.cfg.ID)
	}
	return from, 0, ""
}

// directHasToken reports whether header key lists token
// (case-insensitively), as in "Connection: keep-alive, Upgrade".
func directHasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

func (t *DirectTransport) trackConn(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

func (t *DirectTransport) untrackConn(c net.Conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	_ = c.Close()
}

// readFrames reads frames from one peer's stream into Recv until the
// stream ends, a frame is oversized, or Close.
func (t *DirectTransport) readFrames(r *bufio.Reader, from uint64) {
	var hdr [4]byte
	buf := make([]byte, 4096)
	for t.ctx.Err() == nil {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[:]))
		if n == 0 || n > DirectMaxFrame {
			t.refused.Add(1)
			t.log.Warn("paxos: bad frame size, closing stream", "peer", from, "bytes", n, "limit", DirectMaxFrame)
			return
		}
		b := buf
		if n > directKeepBuffer {
			b = make([]byte, n)
		} else if n > cap(buf) {
			buf = make([]byte, n)
			b = buf
		}
		if _, err := io.ReadFull(r, b[:n]); err != nil {
			return
		}
		m, err := Decode(b[:n])
		if err != nil || m.Group != t.cfg.Group || m.To != t.cfg.ID {
			t.discarded.Add(1)
			t.log.Warn("paxos: frame dropped", "peer", from, "err", err, "msg_group", m.Group, "msg_to", uint64(m.To))
			continue
		}
		select {
		case t.recv <- m:
			t.received.Add(1)
		case <-t.ctx.Done():
			return
		}
	}
}
