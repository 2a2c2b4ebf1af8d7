package cli

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
	// maxRejectedLines: more rejected lines than this stop the submission.
	maxRejectedLines = 1000
	// maxLineScan: a line this long with no newline stops the submission.
	maxLineScan = 1 << 20
)

// errNotJSONL stops a submission whose input is not JSONL text.
var errNotJSONL = errors.New("the input is not JSONL")

// lineReader reads a JSONL submission line by line.
type lineReader struct {
	r        *bufio.Reader
	lineNo   int
	read     int64
	rejected int // lines rejected so far
}

// lineChunk is a chunk of a JSONL submission: up to submitChunk valid tasks
// (and at most submitChunkBytes of them) with their line numbers, the lines
// rejected among them, how many bytes were read by its end, whether the
// input ended, and why the submission must stop, if it must.
type lineChunk struct {
	batch    []queue.Task
	lines    []int
	rejected []queue.LineError
	read     int64
	eof      bool
	stop     error
}

// submitChunkBytes bounds the bytes of lines a chunk holds.
const submitChunkBytes = 32 << 20

// chunk reads the next chunk.
func (lr *lineReader) chunk() (c lineChunk) {
	defer func() { c.read = lr.read }()
	size := 0
	reject := func(e queue.LineError) {
		c.rejected = append(c.rejected, e)
		lr.rejected++
	}
	for len(c.batch) < submitChunk && size < submitChunkBytes {
		line, err := readLine(lr.r, queue.MaxPayload*2, maxLineScan)
		lr.read += int64(line.n)
		size += line.n
		if err == io.EOF && line.n == 0 {
			c.eof = true
			return c
		}
		if err != nil && err != io.EOF {
			c.stop = fmt.Errorf("read line %d: %w", lr.lineNo+1, err)
			return c
		}
		lr.lineNo++
		if lr.lineNo == 1 {
			line.text = bytes.TrimPrefix(line.text, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
		}
		switch {
		case line.endless:
			c.stop = fmt.Errorf("%w: line %d runs past %d MiB without a newline", errNotJSONL, lr.lineNo, maxLineScan>>20)
			return c
		case bytes.IndexByte(line.text, 0) >= 0:
			c.stop = fmt.Errorf("%w: line %d holds a NUL byte", errNotJSONL, lr.lineNo)
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
				c.batch = append(c.batch, t)
				c.lines = append(c.lines, lr.lineNo)
			}
		}
		if lr.rejected > maxRejectedLines {
			c.stop = fmt.Errorf("%w: more than %d lines rejected", errNotJSONL, maxRejectedLines)
			return c
		}
		if err == io.EOF {
			c.eof = true
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
