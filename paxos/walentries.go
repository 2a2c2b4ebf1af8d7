package paxos

import "slices"

// walChunkBytes is the size of the chunks walEntries appends encodings to.
const walChunkBytes = 1 << 20

// walEntries is what the acceptor log holds of the accepted entries, by
// slot, as encoded: what the log's next generation is written from. A
// busy node holds tens of thousands between snapshots; as a map of byte
// slices each was an object the garbage collector marked on every cycle
// (see byteLog). Here the encodings are appended to chunks and the index
// holds where each is, so nothing in it holds a pointer the collector
// scans. A slot accepted again leaves its old bytes behind until keepAbove
// copies what is kept.
//
// The zero value is empty.
type walEntries struct {
	at     map[uint64]walSpan
	chunks [][]byte
}

// walSpan is where one encoding is: bytes [off, off+n) of chunks[chunk].
type walSpan struct{ chunk, off, n uint32 }

// len is how many slots hold an entry.
func (w *walEntries) len() int { return len(w.at) }

// put makes v the encoding at slot (a copy of it is kept).
func (w *walEntries) put(slot uint64, v []byte) {
	if w.at == nil {
		w.at = map[uint64]walSpan{}
	}
	k := len(w.chunks) - 1
	if k < 0 || len(w.chunks[k])+len(v) > cap(w.chunks[k]) {
		w.chunks = append(w.chunks, make([]byte, 0, max(walChunkBytes, len(v))))
		k++
	}
	w.at[slot] = walSpan{chunk: uint32(k), off: uint32(len(w.chunks[k])), n: uint32(len(v))}
	w.chunks[k] = append(w.chunks[k], v...)
}

// get is the encoding at slot, if any; it aliases the kept bytes.
func (w *walEntries) get(slot uint64) ([]byte, bool) {
	p, ok := w.at[slot]
	if !ok {
		return nil, false
	}
	return w.chunks[p.chunk][p.off : p.off+p.n : p.off+p.n], true
}

// slots are the slots that hold an entry, in order.
func (w *walEntries) slots() []uint64 {
	out := make([]uint64, 0, len(w.at))
	for s := range w.at {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// keepAbove forgets the entries at and below index and copies the rest
// into new chunks, freeing the old ones and the bytes of overwritten
// entries.
func (w *walEntries) keepAbove(index uint64) {
	var next walEntries
	for s := range w.at { // in any order: slots sorts when order matters
		if s > index {
			v, _ := w.get(s)
			next.put(s, v)
		}
	}
	*w = next
}
