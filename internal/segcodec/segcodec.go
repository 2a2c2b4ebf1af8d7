// Package segcodec is the stored form of the values of a queue segment's
// runs, tries and outcome batches, shared by package queue, which writes
// them, and package task, which reads which slots a run holds. Its
// appenders and Reader also serve package queue's binary form of a
// segment's tasks.
package segcodec

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Runs, tries and outcome batches are read by every claim and every
// outcome, so their values are a compact binary form rather than JSON
// (JSON decoding was a tenth of a worker's CPU). Each starts with a format
// byte; a value that starts with '{' is read as JSON.
//
//	run:     0x01 worker claimedAt n (slot attempt)×n
//	outcome: 0x01 worker token claimedAt finishedAt
//	         nOK (slot attempt len(result) result)×nOK nMoved slot×nMoved
//
// Strings and results are a uvarint length and the bytes; times are
// varint Unix nanoseconds (0 for the zero time); the rest are varints.
const segCodecV1 = 0x01

// Run is what a run and its try hold: the slots claimed, the attempt each
// starts, the worker and when.
type Run struct {
	Worker    string    `json:"w"`
	ClaimedAt time.Time `json:"t"`
	Slots     []int     `json:"s"`
	Attempts  []int     `json:"a"`
}

// Out is one batch of outcomes of a run: the slots that succeeded, with
// attempt and result, and the slots that moved out of the segment (to
// records of their own: retrying, dead, handed back).
type Out struct {
	Worker     string    `json:"w"`
	Token      int64     `json:"k"`
	ClaimedAt  time.Time `json:"c"`
	FinishedAt time.Time `json:"f"`
	OK         []OKSlot  `json:"ok,omitempty"`
	Moved      []int     `json:"m,omitempty"`
}

// OKSlot is a slot that succeeded: its attempt and result.
type OKSlot struct {
	Slot    int    `json:"s"`
	Attempt int    `json:"a"`
	Result  []byte `json:"r,omitempty"`
}

// errTruncated is returned for a value that ends too soon.
var errTruncated = errors.New("value ends too soon")

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

// Encode returns v's stored form.
func (v Run) Encode() []byte {
	b := make([]byte, 0, 16+len(v.Worker)+4*len(v.Slots))
	b = append(b, segCodecV1)
	b = AppendBytes(b, []byte(v.Worker))
	b = AppendTime(b, v.ClaimedAt)
	b = binary.AppendUvarint(b, uint64(len(v.Slots)))
	for i, s := range v.Slots {
		a := 0
		if i < len(v.Attempts) {
			a = v.Attempts[i]
		}
		b = binary.AppendVarint(b, int64(s))
		b = binary.AppendVarint(b, int64(a))
	}
	return b
}

// Encode returns o's stored form.
func (o Out) Encode() []byte {
	n := 32 + len(o.Worker) + 3*len(o.Moved)
	for _, s := range o.OK {
		n += 6 + len(s.Result)
	}
	b := make([]byte, 0, n)
	b = append(b, segCodecV1)
	b = AppendBytes(b, []byte(o.Worker))
	b = binary.AppendVarint(b, o.Token)
	b = AppendTime(b, o.ClaimedAt)
	b = AppendTime(b, o.FinishedAt)
	b = binary.AppendUvarint(b, uint64(len(o.OK)))
	for _, s := range o.OK {
		b = binary.AppendVarint(b, int64(s.Slot))
		b = binary.AppendVarint(b, int64(s.Attempt))
		b = AppendBytes(b, s.Result)
	}
	b = binary.AppendUvarint(b, uint64(len(o.Moved)))
	for _, s := range o.Moved {
		b = binary.AppendVarint(b, int64(s))
	}
	return b
}

// Reader reads the fields of a stored value in order (varints, counts,
// length-prefixed bytes, times as AppendTime writes them); the first error
// sticks and Err returns it. Package queue reads a segment's tasks with it
// too.
type Reader struct {
	b   []byte
	err error
}

// NewReader reads b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// Err is the first error a read met: the value ended too soon.
func (d *Reader) Err() error { return d.err }

// Len is how many bytes are left to read.
func (d *Reader) Len() int { return len(d.b) }

// Byte reads one byte.
func (d *Reader) Byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = errTruncated
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
		d.err = errTruncated
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
		d.err = errTruncated
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
		d.err = errTruncated
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

// Bytes reads a uvarint length and as many bytes; they alias the value.
func (d *Reader) Bytes() []byte {
	n := d.Count()
	if d.err != nil || n > len(d.b) {
		d.err = errTruncated
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

// start checks the format byte; ok false says the value is JSON.
func (d *Reader) start() (binaryForm bool, err error) {
	switch {
	case len(d.b) == 0:
		return false, errTruncated
	case d.b[0] == '{':
		return false, nil
	case d.b[0] != segCodecV1:
		return false, fmt.Errorf("unknown format %#x", d.b[0])
	}
	d.b = d.b[1:]
	return true, nil
}

// DecodeRun reads a run's or a try's value.
func DecodeRun(b []byte) (Run, error) {
	var v Run
	d := Reader{b: b}
	bin, err := d.start()
	if err != nil {
		return v, err
	}
	if !bin {
		err := json.Unmarshal(b, &v)
		return v, err
	}
	v.Worker = string(d.Bytes())
	v.ClaimedAt = d.Time()
	n := d.Count()
	if d.err == nil {
		v.Slots, v.Attempts = make([]int, n), make([]int, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		v.Slots[i], v.Attempts[i] = int(d.Varint()), int(d.Varint())
	}
	return v, d.err
}

// DecodeOut reads an outcome batch's value.
func DecodeOut(b []byte) (*Out, error) {
	o := new(Out)
	d := Reader{b: b}
	bin, err := d.start()
	if err != nil {
		return nil, err
	}
	if !bin {
		if err := json.Unmarshal(b, o); err != nil {
			return nil, err
		}
		return o, nil
	}
	o.Worker = string(d.Bytes())
	o.Token = d.Varint()
	o.ClaimedAt, o.FinishedAt = d.Time(), d.Time()
	if n := d.Count(); n > 0 {
		o.OK = make([]OKSlot, n)
		for i := 0; i < n && d.err == nil; i++ {
			o.OK[i].Slot, o.OK[i].Attempt = int(d.Varint()), int(d.Varint())
			if r := d.Bytes(); len(r) > 0 {
				o.OK[i].Result = append([]byte(nil), r...)
			}
		}
	}
	if n := d.Count(); n > 0 {
		o.Moved = make([]int, n)
		for i := 0; i < n && d.err == nil; i++ {
			o.Moved[i] = int(d.Varint())
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	return o, nil
}
