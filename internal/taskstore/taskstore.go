// Package taskstore is the stored form of a queued task that more than
// one package reads: the values of a queue segment's runs, tries and
// outcome batches (written by package queue; read by package queue and by
// checks of the store), and the rule that a task id has one holder at a
// time, a queue worker or a task runner (holder.go), which package queue's
// claims and package task's runner each keep. The keys themselves are
// package keyspace's.
package taskstore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/droverhq/drover/internal/varcodec"
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
// varint Unix nanoseconds (0 for the zero time); the rest are varints
// (package varcodec's forms).
const formatV1 = 0x01

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

// Encode returns v's stored form.
func (v Run) Encode() []byte {
	b := make([]byte, 0, 16+len(v.Worker)+4*len(v.Slots))
	b = append(b, formatV1)
	b = varcodec.AppendBytes(b, []byte(v.Worker))
	b = varcodec.AppendTime(b, v.ClaimedAt)
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
	b = append(b, formatV1)
	b = varcodec.AppendBytes(b, []byte(o.Worker))
	b = binary.AppendVarint(b, o.Token)
	b = varcodec.AppendTime(b, o.ClaimedAt)
	b = varcodec.AppendTime(b, o.FinishedAt)
	b = binary.AppendUvarint(b, uint64(len(o.OK)))
	for _, s := range o.OK {
		b = binary.AppendVarint(b, int64(s.Slot))
		b = binary.AppendVarint(b, int64(s.Attempt))
		b = varcodec.AppendBytes(b, s.Result)
	}
	b = binary.AppendUvarint(b, uint64(len(o.Moved)))
	for _, s := range o.Moved {
		b = binary.AppendVarint(b, int64(s))
	}
	return b
}

// start checks b's format byte: it returns what follows it in the binary
// form, or binaryForm false for a JSON value.
func start(b []byte) (rest []byte, binaryForm bool, err error) {
	switch {
	case len(b) == 0:
		return nil, false, varcodec.ErrTruncated
	case b[0] == '{':
		return nil, false, nil
	case b[0] != formatV1:
		return nil, false, fmt.Errorf("unknown format %#x", b[0])
	}
	return b[1:], true, nil
}

// DecodeRun reads a run's or a try's value.
func DecodeRun(b []byte) (Run, error) {
	var v Run
	rest, bin, err := start(b)
	if err != nil {
		return v, err
	}
	if !bin {
		err := json.Unmarshal(b, &v)
		return v, err
	}
	d := varcodec.MakeReader(rest)
	v.Worker = string(d.Bytes())
	v.ClaimedAt = d.Time()
	n := d.Count()
	if d.Err() == nil {
		v.Slots, v.Attempts = make([]int, n), make([]int, n)
	}
	for i := 0; i < n && d.Err() == nil; i++ {
		v.Slots[i], v.Attempts[i] = int(d.Varint()), int(d.Varint())
	}
	return v, d.Err()
}

// DecodeOut reads an outcome batch's value.
func DecodeOut(b []byte) (*Out, error) {
	o := new(Out)
	rest, bin, err := start(b)
	if err != nil {
		return nil, err
	}
	if !bin {
		if err := json.Unmarshal(b, o); err != nil {
			return nil, err
		}
		return o, nil
	}
	d := varcodec.MakeReader(rest)
	o.Worker = string(d.Bytes())
	o.Token = d.Varint()
	o.ClaimedAt, o.FinishedAt = d.Time(), d.Time()
	if n := d.Count(); n > 0 {
		o.OK = make([]OKSlot, n)
		for i := 0; i < n && d.Err() == nil; i++ {
			o.OK[i].Slot, o.OK[i].Attempt = int(d.Varint()), int(d.Varint())
			if r := d.Bytes(); len(r) > 0 {
				o.OK[i].Result = append([]byte(nil), r...)
			}
		}
	}
	if n := d.Count(); n > 0 {
		o.Moved = make([]int, n)
		for i := 0; i < n && d.Err() == nil; i++ {
			o.Moved[i] = int(d.Varint())
		}
	}
	if d.Err() != nil {
		return nil, d.Err()
	}
	return o, nil
}
