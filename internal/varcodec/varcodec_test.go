package varcodec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// What the appenders write, the Reader reads back in order.
func TestRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 24, 6, 30, 0, 123456789, time.UTC)
	var b []byte
	b = append(b, 7)
	b = binary.AppendVarint(b, -42)
	b = binary.AppendUvarint(b, 1<<40)
	b = AppendBytes(b, []byte("hello"))
	b = AppendBytes(b, nil)
	b = AppendTime(b, at)
	b = AppendTime(b, time.Time{})
	b = binary.AppendUvarint(b, 2) // a count of two one-byte elements
	b = append(b, 1, 2)
	d := NewReader(b)
	if d.Byte() != 7 || d.Varint() != -42 || d.Uvarint() != 1<<40 {
		t.Fatal("numbers read wrong")
	}
	if got := d.Bytes(); !bytes.Equal(got, []byte("hello")) {
		t.Fatalf("bytes: got %q", got)
	}
	if got := d.Bytes(); len(got) != 0 {
		t.Fatalf("empty bytes: got %q", got)
	}
	if got := d.Time(); !got.Equal(at) || got.Location() != time.UTC {
		t.Fatalf("time: got %v", got)
	}
	if got := d.Time(); !got.IsZero() {
		t.Fatalf("zero time: got %v", got)
	}
	if n := d.Count(); n != 2 || d.Len() != 2 {
		t.Fatalf("count: got %d with %d bytes left", n, d.Len())
	}
	d.Byte()
	d.Byte()
	if d.Err() != nil || d.Len() != 0 {
		t.Fatalf("err %v, %d bytes left", d.Err(), d.Len())
	}
}

// A read past the end is ErrTruncated, and the error sticks: every later
// read returns the zero value.
func TestTruncated(t *testing.T) {
	reads := map[string]func(*Reader){
		"byte":    func(d *Reader) { d.Byte() },
		"varint":  func(d *Reader) { d.Varint() },
		"uvarint": func(d *Reader) { d.Uvarint() },
		"count":   func(d *Reader) { d.Count() },
		"bytes":   func(d *Reader) { d.Bytes() },
		"time":    func(d *Reader) { d.Time() },
	}
	for name, read := range reads {
		d := MakeReader(nil)
		read(&d)
		if !errors.Is(d.Err(), ErrTruncated) {
			t.Fatalf("%s of nothing: err %v", name, d.Err())
		}
		if d.Varint() != 0 || d.Bytes() != nil || !errors.Is(d.Err(), ErrTruncated) {
			t.Fatalf("%s: the error did not stick", name)
		}
	}
	// A count larger than what is left, and bytes cut short.
	if d := NewReader(binary.AppendUvarint(nil, 5)); d.Count() != 0 || d.Err() == nil {
		t.Fatal("a count past the value's end was read")
	}
	b := AppendBytes(nil, []byte("hello"))
	for i := 0; i < len(b); i++ {
		if d := NewReader(b[:i]); d.Bytes() != nil || d.Err() == nil {
			t.Fatalf("bytes cut to %d of %d were read", i, len(b))
		}
	}
	// An unterminated varint.
	if d := NewReader([]byte{0x80, 0x80}); d.Varint() != 0 || d.Err() == nil {
		t.Fatal("an unterminated varint was read")
	}
}

// Bytes alias the value read, with no room to append into it.
func TestBytesAlias(t *testing.T) {
	b := AppendBytes(nil, []byte("ab"))
	b = append(b, 'z')
	got := NewReader(b).Bytes()
	if cap(got) != 2 {
		t.Fatalf("cap %d: an append would write over the value", cap(got))
	}
}
