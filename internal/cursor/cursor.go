// Package cursor encodes the opaque page cursors of drover's task search.
//
// A cursor says where the next page starts and carries a digest of the
// query that gave it, so that a cursor handed to another query (another
// queue, other filters) is refused instead of silently skipping tasks.
// It also carries the query's time window as first resolved, so that
// "the last hour" means the same hour on every page.
//
//	s := cursor.Encode(cursor.Cursor{Digest: cursor.Digest("q", "PENDING"), Phase: "s", Key: seg})
//	c, err := cursor.Decode(s) // base64url of a small JSON object
package cursor

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/droverhq/drover"
)

// MaxLen bounds an encoded cursor.
const MaxLen = 1024

// Cursor is a place in a search's walk.
type Cursor struct {
	// Digest is the digest of the query the cursor continues.
	Digest string `json:"d"`
	// Phase names the part of the walk: the id index, the tasks with
	// records of their own, or the segments.
	Phase string `json:"p"`
	// Index is which index of the phase (a status's, for records).
	Index int `json:"i,omitempty"`
	// Key is the place in that index the next page starts after.
	Key string `json:"k,omitempty"`
	// Slot is the last slot of segment Key already walked.
	Slot int `json:"n,omitempty"`
	// Since and Until are the query's time window in Unix nanoseconds as
	// the first page resolved it; 0 when not given.
	Since int64 `json:"s,omitempty"`
	Until int64 `json:"u,omitempty"`
}

// ErrMalformed is returned for a string no Encode made.
var ErrMalformed = errors.New("cursor: not a cursor a search gave")

// The phases of a walk: the id index, the tasks with records of their
// own, the segments.
const (
	PhaseIDs      = "i"
	PhaseRecords  = "r"
	PhaseSegments = "s"
)

// Encode returns c as an opaque string of URL-safe characters.
func Encode(c Cursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Decode reads what Encode wrote. Anyone can write a cursor, so it also
// refuses one whose phase is unknown or whose index, slot or window is
// negative (slot -1 is "before the first"); the search checks the upper
// bounds it knows.
func Decode(s string) (Cursor, error) {
	var c Cursor
	if len(s) > MaxLen {
		return c, ErrMalformed
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return c, ErrMalformed
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || c.Digest == "" || !c.valid() {
		return Cursor{}, ErrMalformed
	}
	return c, nil
}

// valid reports whether c's fields are in their ranges.
func (c Cursor) valid() bool {
	switch c.Phase {
	case PhaseIDs, PhaseRecords, PhaseSegments:
	default:
		return false
	}
	return c.Index >= 0 && c.Slot >= -1 && c.Since >= 0 && c.Until >= 0
}

// ParseTime reads field, a bound of a query's time window: a time in RFC
// 3339, or a duration back from now; "" is no bound (the zero time).
func ParseTime(field, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UTC(), nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d).UTC(), nil
	}
	return time.Time{}, &drover.InputError{Field: field, Value: v,
		Rule: "must be a time in RFC 3339 (2026-11-28T09:00:00Z) or a duration back from now (90m, 24h)"}
}

// SetWindow keeps a query's time window; a zero time is no bound.
func (c *Cursor) SetWindow(since, until time.Time) {
	c.Since, c.Until = nanos(since), nanos(until)
}

// Window returns the time window SetWindow kept.
func (c Cursor) Window() (since, until time.Time) { return timeOf(c.Since), timeOf(c.Until) }

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func timeOf(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// Digest is a short digest of a query's parts, in order. Each part is
// written after its length, so that no two lists of parts give the same
// input, whatever bytes the parts hold.
func Digest(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write(binary.AppendUvarint(nil, uint64(len(p))))
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
