package paxos

import (
	"encoding/binary"
	"hash/maphash"
)

// seenLog is a table's memory of command IDs: the remembered results,
// oldest first, and an index from ID to result. A busy group remembers
// hundreds of thousands (DedupeWindow of writes), so the layout is chosen
// for what that costs the process, not only for lookups:
//
//   - Each result is kept encoded, exactly as a format-3 snapshot holds it
//     (appendTableSeen), in a byteLog, which the garbage collector never
//     scans, and so is the index (a map from a 64-bit hash of the ID to
//     the result's position): as structs with five strings each, plus a
//     map keyed by the ID strings, three nodes' memories made a live heap
//     of 350 MB that every collection marked, and the requests' tail grew
//     with it over the window's first minutes (docs/bench-log/paxos.md). A
//     snapshot copies the log's bytes instead of encoding each result.
//   - Two IDs whose hashes are equal are told apart by the ID stored in
//     the result; the later one is indexed in clash, by its ID.
//
// The zero value is empty.
type seenLog struct {
	raw   byteLog
	base  int // results ever dropped: the position of the oldest kept
	index map[uint64]int
	clash map[string]int
	seed  maphash.Seed
	// mask narrows the hash (tests make IDs collide); 0 keeps it whole.
	mask uint64
}

// len is how many results the log keeps.
func (l *seenLog) len() int { return l.raw.n }

// rawAt is the encoding of the i-th result kept, the oldest being 0.
func (l *seenLog) rawAt(i int) []byte { return l.raw.at(i) }

// at is the i-th result kept, the oldest being 0.
func (l *seenLog) at(i int) tableSeen {
	s, _ := decodeTableSeen(l.rawAt(i))
	return s
}

// hashString and hashBytes hash an ID (equal for equal bytes).
func (l *seenLog) hashString(id string) uint64 { return l.narrow(maphash.String(l.seed, id)) }
func (l *seenLog) hashBytes(id []byte) uint64  { return l.narrow(maphash.Bytes(l.seed, id)) }

func (l *seenLog) narrow(h uint64) uint64 {
	if l.mask != 0 {
		return h & l.mask
	}
	return h
}

// position is where the result remembered for id is kept (its index
// from the oldest), if any.
func (l *seenLog) position(id string) (int, bool) {
	if l.index == nil { // nothing pushed yet: no seed to hash with
		return 0, false
	}
	if p, ok := l.clash[id]; ok {
		return p - l.base, true
	}
	p, ok := l.index[l.hashString(id)]
	if !ok || string(seenID(l.rawAt(p-l.base))) != id {
		return 0, false
	}
	return p - l.base, true
}

// find is the result remembered for id, if any.
func (l *seenLog) find(id string) (tableSeen, bool) {
	i, ok := l.position(id)
	if !ok {
		return tableSeen{}, false
	}
	return l.at(i), true
}

// push appends s, which becomes the result remembered for s.ID.
func (l *seenLog) push(s tableSeen) {
	if l.index == nil {
		l.index, l.clash, l.seed = map[uint64]int{}, map[string]int{}, maphash.MakeSeed()
	}
	b := l.raw.next()
	*b = appendTableSeen(*b, &s)
	pos := l.base + l.raw.n - 1
	h := l.hashString(s.ID)
	if p, ok := l.index[h]; ok && string(seenID(l.rawAt(p-l.base))) != s.ID {
		l.clash[s.ID] = pos
		return
	}
	delete(l.clash, s.ID)
	l.index[h] = pos
}

// replace replaces the result remembered for s.ID, if any, in a copy of
// its chunk.
func (l *seenLog) replace(s tableSeen) {
	i, ok := l.position(s.ID)
	if !ok {
		return
	}
	l.raw.replace(i, appendTableSeen(nil, &s))
}

// dropWhile forgets the oldest results while old says so of their Time,
// freeing the chunks they filled, and returns how many it forgot.
func (l *seenLog) dropWhile(old func(time int64) bool) int {
	n := 0
	for n < l.raw.n {
		raw := l.rawAt(n)
		id := seenID(raw)
		if !old(seenTime(raw)) {
			break
		}
		pos := l.base + n // l.index is set: something was pushed
		h := l.hashBytes(id)
		if p, ok := l.index[h]; ok && p == pos {
			delete(l.index, h)
		} else if p, ok := l.clash[string(id)]; ok && p == pos {
			delete(l.clash, string(id))
		}
		n++
	}
	l.raw.drop(n)
	l.base += n
	return n
}

// seenView is a seenLog's results as they were when view was called:
// their encodings, in parts, oldest first.
type seenView struct {
	parts [][]byte
	n     int
}

// view is the results kept as they are now, in bytes that later changes
// to the log do not touch.
func (l *seenLog) view() seenView { return seenView{parts: l.raw.view(), n: l.raw.n} }

// results decodes every result of the view, oldest first (never nil).
func (v seenView) results() []tableSeen {
	out := make([]tableSeen, 0, v.n)
	for _, p := range v.parts {
		for len(p) > 0 {
			s, rest := decodeTableSeen(p)
			if len(rest) == len(p) { // damaged: nothing read
				break
			}
			out = append(out, s)
			p = rest
		}
	}
	return out
}

// seenID is the ID of an encoded result (the bytes alias raw).
func seenID(raw []byte) []byte {
	n, k := binary.Uvarint(raw)
	return raw[k : k+int(n)]
}

// seenTime is the Time of an encoded result.
func seenTime(raw []byte) int64 {
	n, k := binary.Uvarint(raw)
	t, _ := binary.Varint(raw[k+int(n):])
	return t
}
