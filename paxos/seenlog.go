package paxos

import (
	"encoding/binary"
	"hash/maphash"
)

// seenChunk is how many remembered results one chunk of a seenLog holds.
const seenChunk = 1024

// seenChunkBytes is the room a chunk's encoded results start with (about
// 55 bytes each when the result repeats its request).
const seenChunkBytes = 64 << 10

// seenLog is a table's memory of command IDs: the remembered results,
// oldest first, and an index from ID to result. A busy group remembers
// hundreds of thousands (DedupeWindow of writes), so the layout is chosen
// for what that costs the process, not only for lookups:
//
//   - Each result is kept encoded, exactly as a format-3 snapshot holds it
//     (appendTableSeen), in chunks of seenChunk results. The chunks and
//     the index (a map from a 64-bit hash of the ID to the result's
//     position) hold no pointers, so the garbage collector never scans
//     them: as structs with five strings each, plus a map keyed by the ID
//     strings, three nodes' memories made a live heap of 350 MB that
//     every collection marked, and the requests' tail grew with it over
//     the window's first minutes (docs/BENCHMARKS.md). A snapshot copies
//     the chunks' bytes instead of encoding each result.
//   - Chunks are never copied to grow the log, and dropping the oldest
//     results frees whole chunks. A chunk's bytes and offsets are only
//     appended to, and replace copies its chunk, so a view taken for a
//     snapshot stays valid, on another goroutine, while results are
//     pushed, replaced and dropped.
//   - Two IDs whose hashes are equal are told apart by the ID stored in
//     the result; the later one is indexed in clash, by its ID.
//
// The zero value is empty.
type seenLog struct {
	chunks []seenPart // all full but the last; chunks[0] starts at head
	head   int        // results dropped from chunks[0]
	n      int        // results kept
	base   int        // results ever dropped: the position of the oldest kept
	index  map[uint64]int
	clash  map[string]int
	seed   maphash.Seed
	// mask narrows the hash (tests make IDs collide); 0 keeps it whole.
	mask uint64
}

// seenPart is one chunk: its results' encodings, one after another, and
// where each begins.
type seenPart struct {
	data []byte
	offs []int
}

// raw is the encoding of the chunk's k-th result.
func (p seenPart) raw(k int) []byte {
	end := len(p.data)
	if k+1 < len(p.offs) {
		end = p.offs[k+1]
	}
	return p.data[p.offs[k]:end]
}

// len is how many results the log keeps.
func (l *seenLog) len() int { return l.n }

// rawAt is the encoding of the i-th result kept, the oldest being 0.
func (l *seenLog) rawAt(i int) []byte {
	j := l.head + i
	return l.chunks[j/seenChunk].raw(j % seenChunk)
}

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
	if k := len(l.chunks); k == 0 || len(l.chunks[k-1].offs) == seenChunk {
		l.chunks = append(l.chunks, seenPart{data: make([]byte, 0, seenChunkBytes), offs: make([]int, 0, seenChunk)})
	}
	last := &l.chunks[len(l.chunks)-1]
	last.offs = append(last.offs, len(last.data))
	last.data = appendTableSeen(last.data, &s)
	pos := l.base + l.n
	l.n++
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
	j := l.head + i
	old, k := l.chunks[j/seenChunk], j%seenChunk
	c := seenPart{data: make([]byte, 0, cap(old.data)), offs: make([]int, 0, seenChunk)}
	for x := range old.offs {
		c.offs = append(c.offs, len(c.data))
		if x == k {
			c.data = appendTableSeen(c.data, &s)
		} else {
			c.data = append(c.data, old.raw(x)...)
		}
	}
	l.chunks[j/seenChunk] = c
}

// dropWhile forgets the oldest results while old says so of their Time,
// freeing the chunks they filled, and returns how many it forgot.
func (l *seenLog) dropWhile(old func(time int64) bool) int {
	n := 0
	for n < l.n {
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
	l.head, l.n, l.base = l.head+n, l.n-n, l.base+n
	for len(l.chunks) > 0 && l.head >= seenChunk {
		l.chunks[0] = seenPart{}
		l.chunks = l.chunks[1:]
		l.head -= seenChunk
	}
	if l.n == 0 {
		l.chunks, l.head = nil, 0 // a last chunk taken up in part goes too
	}
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
func (l *seenLog) view() seenView {
	v := seenView{parts: make([][]byte, 0, len(l.chunks)), n: l.n}
	for k, c := range l.chunks {
		from := 0
		if k == 0 && l.head < len(c.offs) {
			from = c.offs[l.head]
		} else if k == 0 {
			from = len(c.data)
		}
		v.parts = append(v.parts, c.data[from:len(c.data):len(c.data)])
	}
	return v
}

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
