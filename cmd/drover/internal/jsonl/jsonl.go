// Package jsonl reads a JSONL submission of tasks in chunks, line by line:
// valid lines become tasks with their line numbers, bad lines are rejected
// by number, and input that is plainly not JSONL (a binary, an endless
// line, too many bad lines) stops the read at once.
package jsonl

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/droverhq/drover/queue"
)

// Bounds on input that is plainly not JSONL, so that a wrong file (a binary,
// /dev/urandom, /dev/zero) stops at once instead of filling memory or
// running forever.
const (
	// MaxRejectedLines: more rejected lines than this stop the submission.
	MaxRejectedLines = 1000
	// MaxLineScan: a line this long with no newline stops the submission.
	MaxLineScan = 1 << 20
)

// ErrNotJSONL stops a submission whose input is not JSONL text.
var ErrNotJSONL = errors.New("the input is not JSONL")

// ChunkLines is how many lines a chunk holds at most.
const ChunkLines = 20000

// Reader reads a JSONL submission line by line.
type Reader struct {
	r        *bufio.Reader
	lineNo   int
	read     int64
	rejected int // lines rejected so far
}

// NewReader reads the JSONL text of r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 1<<20)} }

// Chunk is a chunk of a JSONL submission: up to ChunkLines valid tasks
// (and at most chunkBytes of them) with their line numbers, the lines
// rejected among them, how many bytes were read by its end, whether the
// input ended, and why the submission must stop, if it must.
type Chunk struct {
	Batch    []queue.Task
	Lines    []int
	Rejected []queue.LineError
	Read     int64
	EOF      bool
	Stop     error
}

// chunkBytes bounds the bytes of lines a chunk holds.
const chunkBytes = 32 << 20

// Chunk reads the next chunk.
func (lr *Reader) Chunk() (c Chunk) {
	defer func() { c.Read = lr.read }()
	size := 0
	reject := func(e queue.LineError) {
		c.Rejected = append(c.Rejected, e)
		lr.rejected++
	}
	for len(c.Batch) < ChunkLines && size < chunkBytes {
		line, err := readLine(lr.r, queue.MaxPayload*2, MaxLineScan)
		lr.read += int64(line.n)
		size += line.n
		if err == io.EOF && line.n == 0 {
			c.EOF = true
			return c
		}
		if err != nil && err != io.EOF {
			c.Stop = fmt.Errorf("read line %d: %w", lr.lineNo+1, err)
			return c
		}
		lr.lineNo++
		if lr.lineNo == 1 {
			line.text = bytes.TrimPrefix(line.text, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
		}
		switch {
		case line.endless:
			c.Stop = fmt.Errorf("%w: line %d runs past %d MiB without a newline", ErrNotJSONL, lr.lineNo, MaxLineScan>>20)
			return c
		case bytes.IndexByte(line.text, 0) >= 0:
			c.Stop = fmt.Errorf("%w: line %d holds a NUL byte", ErrNotJSONL, lr.lineNo)
			return c
		case line.tooLong:
			reject(queue.LineError{Line: lr.lineNo, Error: fmt.Sprintf("line longer than %d bytes: put large inputs behind input_data_uri", queue.MaxPayload*2)})
		case len(bytes.TrimSpace(line.text)) == 0:
			// blank lines are skipped
		default:
			t, perr := queue.ParseLine(line.text)
			if perr != nil {
				reject(queue.LineError{Line: lr.lineNo, Error: perr.Error()})
			} else {
				c.Batch = append(c.Batch, t)
				c.Lines = append(c.Lines, lr.lineNo)
			}
		}
		if lr.rejected > MaxRejectedLines {
			c.Stop = fmt.Errorf("%w: more than %d lines rejected", ErrNotJSONL, MaxRejectedLines)
			return c
		}
		if err == io.EOF {
			c.EOF = true
			return c
		}
	}
	return c
}

type lineRead struct {
	text    []byte
	n       int  // bytes read, newline included
	tooLong bool // longer than max: text is nil
	endless bool // longer than scan without a newline: the rest is unread
}

// readLine reads one line of at most max bytes; a longer line is consumed
// (up to scan bytes) and reported as too long; a line with no newline in its
// first scan bytes is reported as endless.
func readLine(r *bufio.Reader, max, scan int) (lineRead, error) {
	var out lineRead
	for {
		chunk, err := r.ReadSlice('\n')
		out.n += len(chunk)
		if len(out.text)+len(chunk) > max {
			out.tooLong = true
			out.text = nil
		} else if !out.tooLong {
			out.text = append(out.text, chunk...)
		}
		if err == bufio.ErrBufferFull {
			if out.n > scan {
				out.endless, out.text = true, nil
				return out, nil
			}
			continue
		}
		out.text = bytes.TrimRight(out.text, "\r\n")
		return out, err
	}
}
