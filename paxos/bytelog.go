package paxos

// byteChunkRecords is how many records one chunk of a byteLog holds.
const byteChunkRecords = 1024

// byteChunkBytes is the room a chunk's encodings start with (about 64
// bytes a record).
const byteChunkBytes = 64 << 10

// byteLog is a queue of encoded records, oldest first, for what a node
// keeps by the hundred thousand: the table's remembered results
// (seenLog) and the chosen entries kept for catch-ups (chosenLog). The
// records are kept in chunks of byteChunkRecords whose bytes and offsets
// hold no pointers, so the garbage collector never scans them: kept as
// structs of strings, in slices or maps, they were most of what each
// collection marked, and a collection's mark phase (at 1,800 cycles/s
// 43-56 ms on average and up to 380 ms with them, 3-4 ms without) is when
// the requests' tail piled up (docs/bench-log/paxos.md).
//
// Chunks are never copied to grow the log, and dropping the oldest
// records frees whole chunks. A chunk's bytes and offsets are only
// appended to, and replace copies its chunk, so the parts returned by
// view stay valid, on another goroutine, while records are pushed,
// replaced and dropped.
//
// The zero value is empty.
type byteLog struct {
	chunks []byteChunk // all full but the last; chunks[0] starts at head
	head   int         // records dropped from chunks[0]
	n      int         // records kept
}

// byteChunk is one chunk: its records' encodings, one after another, and
// where each begins.
type byteChunk struct {
	data []byte
	offs []int
}

// raw is the encoding of the chunk's k-th record.
func (c byteChunk) raw(k int) []byte {
	end := len(c.data)
	if k+1 < len(c.offs) {
		end = c.offs[k+1]
	}
	return c.data[c.offs[k]:end]
}

// at is the encoding of the i-th record kept, the oldest being 0.
func (l *byteLog) at(i int) []byte {
	j := l.head + i
	return l.chunks[j/byteChunkRecords].raw(j % byteChunkRecords)
}

// next starts a record after the last and returns the bytes its
// encoding is to be appended to (and nothing else).
func (l *byteLog) next() *[]byte {
	if k := len(l.chunks); k == 0 || len(l.chunks[k-1].offs) == byteChunkRecords {
		l.chunks = append(l.chunks, byteChunk{data: make([]byte, 0, byteChunkBytes), offs: make([]int, 0, byteChunkRecords)})
	}
	last := &l.chunks[len(l.chunks)-1]
	last.offs = append(last.offs, len(last.data))
	l.n++
	return &last.data
}

// replace makes raw the encoding of the i-th record kept, in a copy of
// its chunk.
func (l *byteLog) replace(i int, raw []byte) {
	j := l.head + i
	old, k := l.chunks[j/byteChunkRecords], j%byteChunkRecords
	c := byteChunk{data: make([]byte, 0, cap(old.data)), offs: make([]int, 0, byteChunkRecords)}
	for x := range old.offs {
		c.offs = append(c.offs, len(c.data))
		if x == k {
			c.data = append(c.data, raw...)
		} else {
			c.data = append(c.data, old.raw(x)...)
		}
	}
	l.chunks[j/byteChunkRecords] = c
}

// drop forgets the k oldest records (at most all), freeing the chunks
// they filled.
func (l *byteLog) drop(k int) {
	k = min(k, l.n)
	l.head, l.n = l.head+k, l.n-k
	for len(l.chunks) > 0 && l.head >= byteChunkRecords {
		l.chunks[0] = byteChunk{}
		l.chunks = l.chunks[1:]
		l.head -= byteChunkRecords
	}
	if l.n == 0 {
		l.chunks, l.head = nil, 0 // a last chunk taken up in part goes too
	}
}

// view is the records kept as they are now, in parts, oldest first, in
// bytes that later changes to the log do not touch.
func (l *byteLog) view() [][]byte {
	parts := make([][]byte, 0, len(l.chunks))
	for k, c := range l.chunks {
		from := 0
		if k == 0 && l.head < len(c.offs) {
			from = c.offs[l.head]
		} else if k == 0 {
			from = len(c.data)
		}
		parts = append(parts, c.data[from:len(c.data):len(c.data)])
	}
	return parts
}
