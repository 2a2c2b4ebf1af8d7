package agentserver

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"sync"
	"time"
)

// graphNamespace is LangGraph's NAMESPACE_GRAPH: the assistant a graph's
// runtime registers for graph g has id uuid5(graphNamespace, g), so that
// a graph's name stands for its assistant wherever an assistant id goes.
var graphNamespace = [16]byte{0x6b, 0xa7, 0xb8, 0x21, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8}

// idSource makes UUIDv7s, time ordered as LangGraph's own ids, and
// ordered within one millisecond too: its 12 bits after the version are a
// counter (RFC 9562's method 1), so that each id sorts after the one made
// before it by the same source, even when the clock went back.
type idSource struct {
	mu  sync.Mutex
	ms  int64  // the millisecond of the last id
	seq uint16 // its counter, below 0x1000
}

// next returns a new id of now's millisecond, or of the last id's when
// that is later.
func (g *idSource) next(now time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[8:])
	g.mu.Lock()
	ms := now.UnixMilli()
	switch {
	case ms > g.ms:
		g.ms, g.seq = ms, 0
	case g.seq < 0xfff:
		g.seq++
	default: // the counter is spent: borrow the next millisecond
		g.ms, g.seq = g.ms+1, 0
	}
	ms, seq := g.ms, g.seq
	g.mu.Unlock()
	binary.BigEndian.PutUint16(b[0:2], uint16(uint64(ms)>>32))
	binary.BigEndian.PutUint32(b[2:6], uint32(ms))
	binary.BigEndian.PutUint16(b[6:8], 0x7000|seq)
	b[8] = 0x80 | b[8]&0x3f
	return format(b)
}

// graphAssistantID is the id of graph g's own assistant (UUIDv5).
func graphAssistantID(g string) string {
	h := sha1.New()
	h.Write(graphNamespace[:])
	h.Write([]byte(g))
	var b [16]byte
	copy(b[:], h.Sum(nil))
	b[6] = 0x50 | b[6]&0x0f
	b[8] = 0x80 | b[8]&0x3f
	return format(b)
}

func format(b [16]byte) string {
	s := hex.EncodeToString(b[:])
	return s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
}

// isUUID reports s in the 8-4-4-4-12 hex form.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
	}
	return true
}

// assistantKeyID is the id an assistant path names: a UUID as is (lower
// case), else a graph's name, which stands for its graph's assistant.
func assistantKeyID(s string) string {
	if isUUID(s) {
		return strings.ToLower(s)
	}
	return graphAssistantID(s)
}
