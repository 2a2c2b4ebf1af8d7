package paxos

import (
	"encoding/binary"
	"hash/fnv"
)

// The table's memory of command IDs. Every write applied in the last
// DedupeWindow of log time is remembered by ID, and the whole memory goes
// into every snapshot, so each entry is kept small: a fingerprint of the
// request rather than the request, and the result with every field that
// the request itself gives back left out (a flag says which). A repeat
// carries the same request (its fingerprint says so), so the result is
// rebuilt from it exactly.

// tableSeen is one remembered result. JSON keys are one letter: they are
// repeated in every snapshot for every remembered ID.
type tableSeen struct {
	ID   string `json:"i"`
	Time int64  `json:"t"` // the Time the command was applied at
	// FP is tableFingerprint of the request; 0 when unknown (restored
	// from a format-1 snapshot), which any request with the ID matches.
	FP    uint64 `json:"f,omitempty"`
	Code  Code   `json:"c"`
	Index uint64 `json:"x,omitempty"`
	Err   string `json:"r,omitempty"`
	// Same flags the result's lock fields that are left out because they
	// are the request's (or the Index, or Time, or Time+TTL).
	Same     uint8  `json:"s,omitempty"`
	Name     string `json:"n,omitempty"`
	Owner    string `json:"o,omitempty"`
	Token    uint64 `json:"k,omitempty"`
	Acquired int64  `json:"a,omitempty"`
	Expires  int64  `json:"e,omitempty"`
	Meta     string `json:"m,omitempty"`
}

// The Same flags: which field of the result's lock is the request's.
const (
	seenName     uint8 = 1 << iota // Name is the command's Lock
	seenOwner                      // Owner is the command's Owner
	seenMeta                       // Meta is the command's Meta
	seenToken                      // Token is the Index
	seenAcquired                   // Acquired is the Time
	seenExpires                    // Expires is Time + the command's TTL
	seenTokenCmd                   // Token is the command's Token
)

// tableRememberAll keeps r, remembered for id at now, whole.
func tableRememberAll(id string, fp uint64, now int64, r Result) tableSeen {
	s := tableSeen{ID: id, Time: now, FP: fp, Code: r.Code, Index: r.Index, Err: r.Err}
	l := r.Lock
	s.Name, s.Owner, s.Token, s.Acquired, s.Expires, s.Meta = l.Name, l.Owner, l.Token, l.Acquired, l.Expires, l.Meta
	return s
}

// tableRemember compacts r, the result of cmd applied at now, for the
// memory. fp is cmd's fingerprint.
func tableRemember(cmd Command, fp uint64, now int64, r Result) tableSeen {
	s := tableRememberAll(cmd.ID, fp, now, r)
	l := r.Lock
	same := func(flag uint8, ok bool) bool {
		if ok {
			s.Same |= flag
		}
		return ok
	}
	if same(seenName, l.Name != "" && l.Name == cmd.Lock) {
		s.Name = ""
	}
	if same(seenOwner, l.Owner != "" && l.Owner == cmd.Owner) {
		s.Owner = ""
	}
	if same(seenMeta, l.Meta != "" && l.Meta == cmd.Meta) {
		s.Meta = ""
	}
	if same(seenToken, l.Token != 0 && l.Token == r.Index) ||
		same(seenTokenCmd, l.Token != 0 && l.Token == cmd.Token) {
		s.Token = 0
	}
	if same(seenAcquired, l.Acquired != 0 && l.Acquired == now) {
		s.Acquired = 0
	}
	if same(seenExpires, l.Expires != 0 && l.Expires == tableAddMillis(now, cmd.TTL)) {
		s.Expires = 0
	}
	return s
}

// result rebuilds the remembered result for cmd, a repeat of the request.
func (s tableSeen) result(cmd Command) Result {
	r := Result{Code: s.Code, Index: s.Index, Err: s.Err}
	r.Lock = LockState{Name: s.Name, Owner: s.Owner, Token: s.Token, Acquired: s.Acquired, Expires: s.Expires, Meta: s.Meta}
	if s.Same&seenName != 0 {
		r.Lock.Name = cmd.Lock
	}
	if s.Same&seenOwner != 0 {
		r.Lock.Owner = cmd.Owner
	}
	if s.Same&seenMeta != 0 {
		r.Lock.Meta = cmd.Meta
	}
	if s.Same&seenToken != 0 {
		r.Lock.Token = s.Index
	}
	if s.Same&seenTokenCmd != 0 {
		r.Lock.Token = cmd.Token
	}
	if s.Same&seenAcquired != 0 {
		r.Lock.Acquired = s.Time
	}
	if s.Same&seenExpires != 0 {
		r.Lock.Expires = tableAddMillis(s.Time, cmd.TTL)
	}
	return r
}

// tableFingerprint is a 64-bit FNV-1a hash of what defines a request: op,
// lock, owner, token, ttl, holder (Meta), and a membership change's node
// and address. Not ID, Time or LockDelay: a retry of the request may be
// stamped by another leader at another time. Never 0.
func tableFingerprint(cmd Command) uint64 {
	h := fnv.New64a()
	var b [8]byte
	str := func(v string) {
		binary.BigEndian.PutUint64(b[:], uint64(len(v)))
		_, _ = h.Write(b[:])
		_, _ = h.Write([]byte(v))
	}
	num := func(v uint64) {
		binary.BigEndian.PutUint64(b[:], v)
		_, _ = h.Write(b[:])
	}
	str(string(cmd.Op))
	str(cmd.Lock)
	str(cmd.Owner)
	num(cmd.Token)
	num(uint64(cmd.TTL))
	str(cmd.Meta)
	num(uint64(cmd.Node))
	str(cmd.Addr)
	return max(h.Sum64(), 1)
}

// tableSeenV1 is a remembered result in a format-1 snapshot: the whole
// result, no fingerprint.
type tableSeenV1 struct {
	ID     string `json:"id"`
	Time   int64  `json:"time"`
	Result Result `json:"result"`
}

// tableSnapshotV1 is the format-1 layout (before tableSeen was compact).
type tableSnapshotV1 struct {
	Seen []tableSeenV1 `json:"seen"`
}

// upgrade converts a format-1 memory: nothing is left out, and the
// fingerprint is unknown.
func (v tableSnapshotV1) upgrade() []tableSeen {
	out := make([]tableSeen, 0, len(v.Seen))
	for _, s := range v.Seen {
		out = append(out, tableRememberAll(s.ID, 0, s.Time, s.Result))
	}
	return out
}
