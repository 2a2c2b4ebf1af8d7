package paxos

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"
)

// chosenEntry is a chosen entry for slot s whose every field is set, and
// differs from one slot to the next.
func chosenEntry(s uint64) Entry {
	ops := []Op{OpAcquire, OpRelease, OpRenew, OpTick, OpNoop, OpAddNode}
	return Entry{Slot: s, Ballot: Ballot{Round: s % 7, Node: NodeID(s % 5)}, Cmd: Command{
		Op: ops[s%uint64(len(ops))], ID: fmt.Sprintf("req-%d", s), Time: 1_700_000_000_000 + int64(s), LockDelay: int64(s % 3),
		Lock: fmt.Sprintf("lock-%d", s%64), Owner: fmt.Sprintf("owner-%d", s%9), TTL: -int64(s), Token: s * 3,
		Node: NodeID(s % 11), Addr: fmt.Sprintf("127.0.0.1:%d", 7000+s%5), Meta: string(bytes.Repeat([]byte{'m'}, int(s%200))),
	}}
}

// TestChosenLog pushes entries across several chunks, reads each back
// whole, drops the oldest through a slot, and checks that an entry that
// does not follow the last starts the log afresh (so it has no gap).
func TestChosenLog(t *testing.T) {
	var c chosenLog
	const from, n = 101, 3*byteChunkRecords + 17
	for s := uint64(from); s < from+n; s++ {
		c.push(chosenEntry(s))
	}
	check := func(lo, hi uint64) {
		t.Helper()
		if c.len() != int(hi-lo+1) || c.first != lo {
			t.Fatalf("log keeps %d entries from %d; want %d from %d", c.len(), c.first, hi-lo+1, lo)
		}
		for s := lo; s <= hi; s++ {
			got, ok := c.get(s)
			if want := chosenEntry(s); !ok || !reflect.DeepEqual(got, want) {
				t.Fatalf("slot %d: got %+v, %v; want %+v", s, got, ok, want)
			}
		}
		for _, s := range []uint64{0, lo - 1, hi + 1, hi + 1000} {
			if _, ok := c.get(s); ok {
				t.Fatalf("slot %d is outside %d..%d but was found", s, lo, hi)
			}
		}
	}
	check(from, from+n-1)
	c.dropThrough(50) // below the first: nothing
	check(from, from+n-1)
	c.dropThrough(from + byteChunkRecords + 3)
	check(from+byteChunkRecords+4, from+n-1)
	if len(c.raw.chunks) != 3 {
		t.Fatalf("%d chunks after dropping a chunk's worth and more; want 3 (the first freed)", len(c.raw.chunks))
	}
	c.push(chosenEntry(from + n + 5)) // a gap: the log restarts there
	check(from+n+5, from+n+5)
	c.dropThrough(from + n + 100)
	if c.len() != 0 {
		t.Fatalf("log keeps %d entries after dropping past its last", c.len())
	}
	c.push(chosenEntry(7))
	check(7, 7)
}

// TestEntryEncoding round-trips entries through the binary encoding and
// checks that a cut or padded encoding is refused.
func TestEntryEncoding(t *testing.T) {
	for _, e := range []Entry{{}, {Slot: 1, Cmd: Command{Op: OpNoop}}, chosenEntry(1 << 40), chosenEntry(199)} {
		raw := appendEntry(nil, &e)
		got, err := decodeEntry(raw)
		if err != nil || !reflect.DeepEqual(got, e) {
			t.Fatalf("round trip of %+v: got %+v, %v", e, got, err)
		}
		for cut := range raw {
			if _, err := decodeEntry(raw[:cut]); err == nil {
				t.Fatalf("%d of %d bytes were taken for an entry", cut, len(raw))
			}
		}
		if _, err := decodeEntry(append(bytes.Clone(raw), 0)); err == nil {
			t.Fatalf("an encoding with a byte after it was taken")
		}
	}
}

// TestEntryEncodingEveryField fills every field of an Entry, by
// reflection, with a value of its own, so that a field added to Command
// later and left out of appendCommand fails here.
func TestEntryEncodingEveryField(t *testing.T) {
	var e Entry
	k := 0
	var fill func(v reflect.Value)
	fill = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				fill(v.Field(i))
			}
		case reflect.String:
			k++
			v.SetString(fmt.Sprintf("field-%d", k))
		case reflect.Int64, reflect.Int:
			k++
			v.SetInt(-int64(k) * 1000)
		case reflect.Uint64:
			k++
			v.SetUint(uint64(k) << 33)
		default:
			t.Fatalf("field of kind %s: teach this test and appendCommand about it", v.Kind())
		}
	}
	fill(reflect.ValueOf(&e).Elem())
	got, err := decodeEntry(appendEntry(nil, &e))
	if err != nil || !reflect.DeepEqual(got, e) {
		t.Fatalf("round trip of %+v: got %+v, %v", e, got, err)
	}
}

// TestWalEntries checks the acceptor log's entries in memory: a slot put
// again has its latest bytes, a value larger than a chunk gets one of its
// own, slots come in order, and keepAbove forgets the low slots and
// copies the rest out of the chunks the overwritten bytes were left in.
func TestWalEntries(t *testing.T) {
	var w walEntries
	val := func(s uint64, v int) []byte {
		return fmt.Appendf(nil, `{"s":%d,"v":%d,"pad":%q}`, s, v, bytes.Repeat([]byte{'x'}, int(s%500)))
	}
	for round := range 3 {
		for s := uint64(1); s <= 5000; s++ {
			w.put(s, val(s, round))
		}
	}
	big := bytes.Repeat([]byte{'b'}, walChunkBytes+10)
	w.put(9000, big)
	before := len(w.chunks)
	if got, ok := w.get(9000); !ok || !bytes.Equal(got, big) {
		t.Fatalf("the value larger than a chunk came back as %d bytes", len(got))
	}
	w.keepAbove(4000)
	if w.len() != 1001 {
		t.Fatalf("%d slots kept above 4000; want 1001", w.len())
	}
	if len(w.chunks) >= before {
		t.Fatalf("keepAbove left %d chunks of %d: the overwritten and dropped bytes were not freed", len(w.chunks), before)
	}
	slots := w.slots()
	for i, s := range slots {
		if want := uint64(4001 + i); i < 1000 && s != want {
			t.Fatalf("slot %d at %d; want %d", s, i, want)
		}
		got, _ := w.get(s)
		want := val(s, 2)
		if s == 9000 {
			want = big
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("slot %d holds %.40q; want its last value %.40q", s, got, want)
		}
	}
	for _, s := range []uint64{1, 4000} {
		if _, ok := w.get(s); ok {
			t.Fatalf("slot %d is at or below 4000 but was kept", s)
		}
	}
}
