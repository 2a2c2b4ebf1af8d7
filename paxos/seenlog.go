package paxos

// seenChunk is how many remembered results one chunk of a seenLog holds.
const seenChunk = 4096

// seenLog is a table's remembered results, oldest first, in chunks of
// seenChunk. It was one slice: append grows a large slice by a quarter,
// copying all of it, and at 400,000 results (a busy group's dedupe window)
// that copy and the fresh 60 MB array held every node's run loop for
// 100-250 ms, all three at the same slot (measured: docs/BENCHMARKS.md).
// Chunks are never copied to grow, and dropping the oldest results frees
// whole chunks. No element is changed in place (set copies its chunk), so
// a view taken for a snapshot stays valid, on another goroutine, while
// results are appended, set and dropped. The zero value is empty.
type seenLog struct {
	chunks [][]tableSeen // all full but the last; chunks[0] starts at head
	head   int           // results dropped from chunks[0]
	n      int           // results kept
}

// len is how many results the log keeps.
func (l *seenLog) len() int { return l.n }

// at is the i-th result kept, the oldest being 0.
func (l *seenLog) at(i int) tableSeen {
	j := l.head + i
	return l.chunks[j/seenChunk][j%seenChunk]
}

// push appends s.
func (l *seenLog) push(s tableSeen) {
	if k := len(l.chunks); k == 0 || len(l.chunks[k-1]) == seenChunk {
		l.chunks = append(l.chunks, make([]tableSeen, 0, seenChunk))
	}
	last := &l.chunks[len(l.chunks)-1]
	*last = append(*last, s)
	l.n++
}

// set replaces the i-th result, in a copy of its chunk.
func (l *seenLog) set(i int, s tableSeen) {
	j := l.head + i
	c := make([]tableSeen, len(l.chunks[j/seenChunk]), seenChunk)
	copy(c, l.chunks[j/seenChunk])
	c[j%seenChunk] = s
	l.chunks[j/seenChunk] = c
}

// drop forgets the n oldest results, freeing the chunks they filled.
func (l *seenLog) drop(n int) {
	l.head, l.n = l.head+n, l.n-n
	for len(l.chunks) > 0 && l.head >= seenChunk {
		l.chunks[0] = nil
		l.chunks = l.chunks[1:]
		l.head -= seenChunk
	}
	if l.n == 0 {
		l.chunks, l.head = nil, 0 // a last chunk taken up in part goes too
	}
}

// view is the results kept as they are now, in chunks that later changes
// to the log do not touch.
func (l *seenLog) view() [][]tableSeen {
	out := make([][]tableSeen, 0, len(l.chunks))
	for k, c := range l.chunks {
		if k == 0 {
			c = c[l.head:]
		}
		out = append(out, c[:len(c):len(c)])
	}
	return out
}
