package stream

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"time"
)

// A chunk's value is the JSON of storedChunk. Every chunk a Writer
// writes is read back by every follower (through the hub's watch) and by
// every reader, so the writer encodes it and the readers decode it here,
// without reflection: at a thousand streams encoding/json's decoding of
// the chunks alone took an eighth of the process's CPU. The format is
// unchanged (what encoding/json writes, field for field), so chunks
// written before still read; a value this decoder does not follow (a
// field out of order, an escaped type) is decoded by encoding/json.

// appendChunk appends c as its key holds it to buf.
func appendChunk(buf []byte, c chunk) []byte {
	buf = append(buf, `{"attempt":`...)
	buf = strconv.AppendInt(buf, int64(c.Attempt), 10)
	buf = append(buf, `,"token":`...)
	buf = strconv.AppendInt(buf, c.Token, 10)
	buf = append(buf, `,"events":`...)
	buf = strconv.AppendInt(buf, c.Events, 10)
	buf = append(buf, `,"bytes":`...)
	buf = strconv.AppendInt(buf, c.Bytes, 10)
	buf = append(buf, `,"list":[`...)
	for i, ev := range c.List {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"s":`...)
		buf = strconv.AppendInt(buf, ev.Seq, 10)
		buf = append(buf, `,"t":`...)
		buf = appendString(buf, ev.Type)
		buf = append(buf, `,"d":`...)
		buf = appendData(buf, ev.Data)
		buf = append(buf, `,"at":`...)
		buf = strconv.AppendInt(buf, ev.Time.UnixNano(), 10)
		buf = append(buf, '}')
	}
	return append(buf, "]}"...)
}

// appendString appends s as a JSON string, byte for byte as
// encoding/json writes it.
func appendString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x7f || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s)
			return append(buf, b...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}

// StoredData is an event's data d as the stream stores it (appendData):
// what a stored event's data reads back as, for comparing with an input's.
func StoredData(d json.RawMessage) []byte { return appendData(nil, d) }

// appendData appends an event's data, a JSON value, compacted (a line
// break in it would end a server-sent event's data line); null if empty.
func appendData(buf []byte, d json.RawMessage) []byte {
	if len(d) == 0 {
		return append(buf, "null"...)
	}
	if !bytes.ContainsAny(d, " \t\r\n<>&\xe2") {
		return append(buf, d...)
	}
	// The slow way, as encoding/json wrote data: compacted, with <, >, &
	// and U+2028/2029 escaped (0xe2 begins the latter two).
	out := bytes.NewBuffer(buf)
	if err := json.Compact(out, d); err != nil { // checked at emit: not reached
		out.Truncate(len(buf))
		out.WriteString("null")
		return out.Bytes()
	}
	compact := append([]byte(nil), out.Bytes()[len(buf):]...)
	out.Truncate(len(buf))
	json.HTMLEscape(out, compact)
	return out.Bytes()
}

// decodeFast decodes v as appendChunk writes it (and encoding/json
// did), or says it cannot (ok false). Events' data are slices of v.
func decodeFast(v []byte) (c chunk, ok bool) {
	// One validation of the whole chunk (not one an event): in a valid
	// document the brackets and strings valueEnd follows delimit each
	// event's data exactly, so every slice it gives is valid JSON too.
	// One call also takes json.Valid's pooled scanner once a chunk, so
	// a collection that empties the pool costs one allocation, not one
	// an event.
	if !json.Valid(v) {
		return chunk{}, false
	}
	d := decoder{b: v}
	var att int64
	if !d.lit(`{"attempt":`) || !d.int(&att) || !d.lit(`,"token":`) || !d.int(&c.Token) ||
		!d.lit(`,"events":`) || !d.int(&c.Events) || !d.lit(`,"bytes":`) || !d.int(&c.Bytes) || !d.lit(`,"list":[`) {
		return chunk{}, false
	}
	c.Attempt = int(att)
	c.List = make([]Event, 0, bytes.Count(v, []byte(`{"s":`)))
	prev := "" // the type of the event before: most are the same
	for first := true; ; first = false {
		if d.lit("]}") {
			return c, d.i == len(v)
		}
		if !first && !d.lit(",") {
			return chunk{}, false
		}
		var ev Event
		var at int64
		if !d.lit(`{"s":`) || !d.int(&ev.Seq) || !d.lit(`,"t":`) || !d.str(&ev.Type, prev) ||
			!d.lit(`,"d":`) || !d.value(&ev.Data) || !d.lit(`,"at":`) || !d.int(&at) || !d.lit("}") {
			return chunk{}, false
		}
		ev.Attempt, ev.Time, prev = c.Attempt, time.Unix(0, at).UTC(), ev.Type
		c.List = append(c.List, ev)
	}
}

// decoder reads a chunk's JSON from b at i.
type decoder struct {
	b []byte
	i int
}

// lit consumes s if b continues with it.
func (d *decoder) lit(s string) bool {
	if len(d.b)-d.i < len(s) {
		return false
	}
	for k := range len(s) {
		if d.b[d.i+k] != s[k] {
			return false
		}
	}
	d.i += len(s)
	return true
}

// int consumes a whole number that fits an int64.
func (d *decoder) int(n *int64) bool {
	j, neg := d.i, false
	if j < len(d.b) && d.b[j] == '-' {
		j, neg = j+1, true
	}
	var v int64
	start := j
	if j+1 < len(d.b) && d.b[j] == '0' && d.b[j+1] >= '0' && d.b[j+1] <= '9' {
		return false // a leading zero: not JSON
	}
	for ; j < len(d.b) && d.b[j] >= '0' && d.b[j] <= '9'; j++ {
		digit := int64(d.b[j] - '0')
		if v > (math.MaxInt64-digit)/10 {
			return false
		}
		v = v*10 + digit
	}
	if j == start {
		return false
	}
	if neg {
		v = -v
	}
	*n, d.i = v, j
	return true
}

// str consumes a string without escapes (one with any is left to
// encoding/json); prev is kept if it is the same.
func (d *decoder) str(s *string, prev string) bool {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return false
	}
	end := bytes.IndexByte(d.b[d.i+1:], '"')
	if end < 0 {
		return false
	}
	b := d.b[d.i+1 : d.i+1+end]
	for _, c := range b {
		// An escape, a control byte or a byte past ASCII (which
		// encoding/json checks as UTF-8) is left to encoding/json.
		if c < 0x20 || c == '\\' || c >= 0x80 {
			return false
		}
	}
	if bytes.Equal(b, []byte(prev)) {
		*s = prev
	} else {
		*s = string(b)
	}
	d.i += end + 2
	return true
}

// value consumes one JSON value, nested or not, and gives its bytes: it
// finds the value's end, then requires no white space at either end, as
// encoding/json would give them (a value written any other way is left
// to encoding/json). The value's validity is the chunk's (decodeFast).
func (d *decoder) value(v *json.RawMessage) bool {
	if !d.valueEnd(v) || len(*v) == 0 {
		return false
	}
	b := *v
	if isSpace(b[0]) || isSpace(b[len(b)-1]) {
		return false
	}
	return true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// valueEnd consumes the bytes of one value, by its brackets and strings.
func (d *decoder) valueEnd(v *json.RawMessage) bool {
	start, depth := d.i, 0
	for d.i < len(d.b) {
		switch c := d.b[d.i]; c {
		case '"':
			if !d.skipString() {
				return false
			}
			if depth == 0 {
				*v = d.b[start:d.i:d.i]
				return true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 { // the end of a scalar at the end of the object
				*v = d.b[start:d.i:d.i]
				return d.i > start
			}
			if depth--; depth == 0 {
				d.i++
				*v = d.b[start:d.i:d.i]
				return true
			}
		case ',':
			if depth == 0 {
				*v = d.b[start:d.i:d.i]
				return d.i > start
			}
		}
		d.i++
	}
	return false
}

// skipString consumes a string, escapes included.
func (d *decoder) skipString() bool {
	for j := d.i + 1; j < len(d.b); j++ {
		switch d.b[j] {
		case '\\':
			j++
		case '"':
			d.i = j + 1
			return true
		}
	}
	return false
}
