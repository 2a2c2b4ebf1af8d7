// Package varcodec is a compact binary form of stored values: appenders
// that write varints, length-prefixed bytes and times, and a Reader that
// reads them back in order. It knows no record of its own: package
// taskstore builds a queue's stored runs and outcomes with it, package
// queue a segment's tasks, package paxos its chosen log and table
// snapshots.
package varcodec

import (
	"encoding/binary"
	"errors"
	"time"
)

// ErrTruncated is the error of a value that ends too soon.
var ErrTruncated = errors.New("value ends too soon")

// AppendTime appends t as varint Unix nanoseconds, 0 for the zero time.
func AppendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.AppendVarint(b, 0)
	}
	return binary.AppendVarint(b, t.UnixNano())
}

// AppendBytes appends s with its uvarint length.
func AppendBytes(b, s []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// Reader reads the fields of a stored value in order (varints, counts,
// length-prefixed bytes, times as AppendTime writes them); the first error
// sticks and Err returns it.
type Reader struct {
	b   []byte
	err error
}

// NewReader reads b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// MakeReader is a Reader of b as a value, for a caller that keeps it on
// its stack.
func MakeReader(b []byte) Reader { return Reader{b: b} }

// Err is the first error a read met: the value ended too soon.
func (d *Reader) Err() error { return d.err }

// Len is how many bytes are left to read.
func (d *Reader) Len() int { return len(d.b) }

// Byte reads one byte.
func (d *Reader) Byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = ErrTruncated
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// Varint reads a varint.
func (d *Reader) Varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = ErrTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Uvarint reads a uvarint.
func (d *Reader) Uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = ErrTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

// Count reads a uvarint count of elements that take a byte at least each.
func (d *Reader) Count() int {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(len(d.b)) { // every element takes a byte at least
		d.err = ErrTruncated
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

// Bytes reads a uvarint length and as many bytes; they alias the value.
func (d *Reader) Bytes() []byte {
	n := d.Count()
	if d.err != nil || n > len(d.b) {
		d.err = ErrTruncated
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

// Time reads a time that AppendTime wrote.
func (d *Reader) Time() time.Time {
	ns := d.Varint()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}
