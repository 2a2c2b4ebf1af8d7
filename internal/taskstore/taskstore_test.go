package taskstore

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

var at = time.Date(2026, 11, 24, 6, 30, 0, 123456789, time.UTC)

// runs are runs and tries as claims write them, and edge cases.
var runs = []Run{
	{Worker: "w-1", ClaimedAt: at, Slots: []int{0, 5, 99}, Attempts: []int{1, 2, 3}},
	{Worker: "", Slots: []int{}, Attempts: []int{}},
	{Worker: "w-ü", ClaimedAt: time.Unix(0, 1).UTC(), Slots: []int{1 << 20}, Attempts: []int{1 << 30}},
	{Worker: "w", ClaimedAt: time.Unix(-5, 0).UTC(), Slots: []int{-1, 0}, Attempts: []int{0, -2}},
}

// outs are outcome batches as workers write them, and edge cases.
var outs = []Out{
	{Worker: "w-2", Token: 1 << 40, ClaimedAt: at, FinishedAt: at.Add(time.Second),
		OK: []OKSlot{{Slot: 3, Attempt: 1, Result: []byte(`{"x":1}`)}, {Slot: 4, Attempt: 2}}, Moved: []int{7, 8}},
	{Worker: "w-3", Token: 5},
	{Worker: "w-4", Token: -1, FinishedAt: at, Moved: []int{0}},
	{Worker: "w-5", Token: 1, OK: []OKSlot{{Slot: 0, Attempt: 1, Result: make([]byte, 300)}}},
}

// Every record reads back as it was written.
func TestRoundTrip(t *testing.T) {
	for _, v := range runs {
		got, err := DecodeRun(v.Encode())
		if err != nil || !reflect.DeepEqual(got, v) {
			t.Fatalf("run %+v: got %+v, %v", v, got, err)
		}
	}
	for _, o := range outs {
		got, err := DecodeOut(o.Encode())
		if err != nil || !reflect.DeepEqual(*got, o) {
			t.Fatalf("out %+v: got %+v, %v", o, got, err)
		}
	}
}

// A run with fewer attempts than slots (never written so, but a value may
// be) is stored with attempt 0 for the slots without one.
func TestRunMissingAttempts(t *testing.T) {
	got, err := DecodeRun(Run{Worker: "w", Slots: []int{4, 5}, Attempts: []int{2}}.Encode())
	if err != nil || !reflect.DeepEqual(got.Attempts, []int{2, 0}) || !reflect.DeepEqual(got.Slots, []int{4, 5}) {
		t.Fatalf("got %+v, %v", got, err)
	}
}

// A decoded outcome's results do not alias the value read: the caller may
// reuse it.
func TestOutResultsAreCopies(t *testing.T) {
	b := outs[0].Encode()
	got, err := DecodeOut(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0
	}
	if string(got.OK[0].Result) != `{"x":1}` {
		t.Fatalf("the result changed with the value: %q", got.OK[0].Result)
	}
}

// Values written as JSON (the form before the binary one) are still read.
func TestReadsJSON(t *testing.T) {
	v := Run{Worker: "w", ClaimedAt: time.Unix(5, 0).UTC(), Slots: []int{1}, Attempts: []int{2}}
	b, _ := json.Marshal(v)
	got, err := DecodeRun(b)
	if err != nil || !reflect.DeepEqual(got, v) {
		t.Fatalf("got %+v, %v", got, err)
	}
	o := Out{Worker: "w", Token: 9, OK: []OKSlot{{Slot: 1, Attempt: 1, Result: []byte("r")}}}
	b, _ = json.Marshal(o)
	gotOut, err := DecodeOut(b)
	if err != nil || !reflect.DeepEqual(*gotOut, o) {
		t.Fatalf("got %+v, %v", gotOut, err)
	}
	// The short field names of the JSON form, as stored.
	got, err = DecodeRun([]byte(`{"w":"x","t":"2026-11-24T06:30:00Z","s":[3,4],"a":[1,1]}`))
	if err != nil || got.Worker != "x" || !reflect.DeepEqual(got.Slots, []int{3, 4}) || !got.ClaimedAt.Equal(at.Truncate(time.Second)) {
		t.Fatalf("stored JSON run: got %+v, %v", got, err)
	}
	gotOut, err = DecodeOut([]byte(`{"w":"x","k":7,"ok":[{"s":2,"a":1,"r":"cg=="}],"m":[5]}`))
	if err != nil || gotOut.Token != 7 || string(gotOut.OK[0].Result) != "r" || !reflect.DeepEqual(gotOut.Moved, []int{5}) {
		t.Fatalf("stored JSON outcome: got %+v, %v", gotOut, err)
	}
	if _, err := DecodeRun([]byte(`{"w":`)); err == nil {
		t.Fatal("broken JSON was read")
	}
	if _, err := DecodeOut([]byte(`{"k":"x"}`)); err == nil {
		t.Fatal("JSON of the wrong shape was read")
	}
}

// Every cut of a value, an empty one, and a value of another format, is
// an error, never a panic or a value read wrong.
func TestRefusesTruncatedValues(t *testing.T) {
	for _, o := range outs {
		b := o.Encode()
		for i := 0; i < len(b); i++ {
			if _, err := DecodeOut(b[:i]); err == nil {
				t.Fatalf("an outcome cut to %d of %d bytes was read", i, len(b))
			}
		}
	}
	for _, v := range runs {
		r := v.Encode()
		for i := 0; i < len(r); i++ {
			if _, err := DecodeRun(r[:i]); err == nil {
				t.Fatalf("a run cut to %d of %d bytes was read", i, len(r))
			}
		}
	}
	for _, b := range [][]byte{{0x7f, 1, 2}, {0x00}, {0x02, 0}} {
		if _, err := DecodeRun(b); err == nil {
			t.Fatalf("a value of an unknown format %#x was read as a run", b[0])
		}
		if _, err := DecodeOut(b); err == nil {
			t.Fatalf("a value of an unknown format %#x was read as an outcome", b[0])
		}
	}
}

// Corrupted values (each byte changed in turn, counts past the value's
// end) give errors or values, never a panic, and never a count of slots
// larger than the value could hold.
func TestCorruptedValues(t *testing.T) {
	for _, b := range [][]byte{runs[0].Encode(), outs[0].Encode()} {
		for i := 1; i < len(b); i++ {
			for _, x := range []byte{0x00, 0x7f, 0x80, 0xff} {
				c := append([]byte(nil), b...)
				c[i] = x
				if v, err := DecodeRun(c); err == nil && len(v.Slots) > len(c) {
					t.Fatalf("a run of %d bytes read %d slots", len(c), len(v.Slots))
				}
				if o, err := DecodeOut(c); err == nil && len(o.OK)+len(o.Moved) > len(c) {
					t.Fatalf("an outcome of %d bytes read %d slots", len(c), len(o.OK)+len(o.Moved))
				}
			}
		}
	}
	// A count of a billion slots in a value of a few bytes.
	huge := []byte{formatV1, 0, 0, 0x80, 0x94, 0xeb, 0xdc, 0x03}
	if _, err := DecodeRun(huge); err == nil {
		t.Fatal("a run with a count past its end was read")
	}
	if _, err := DecodeOut(append([]byte{formatV1, 0, 0, 0, 0}, huge[3:]...)); err == nil {
		t.Fatal("an outcome with a count past its end was read")
	}
}

// Decoding allocates what the value holds and no more: a run's worker,
// slots and attempts, and the run (which the JSON form's decode takes the
// address of); an outcome's worker, itself, its slots and results. The
// reader stays on the stack.
func TestDecodeAllocations(t *testing.T) {
	b := runs[0].Encode()
	if n := testing.AllocsPerRun(100, func() { _, _ = DecodeRun(b) }); n > 4 {
		t.Fatalf("DecodeRun allocates %v times, want at most 4", n)
	}
	o := Out{Worker: "w-2", Token: 1 << 40, OK: []OKSlot{{Slot: 3, Attempt: 1, Result: []byte(`{"x":1}`)}}, Moved: []int{7, 8}}.Encode()
	if n := testing.AllocsPerRun(100, func() { _, _ = DecodeOut(o) }); n > 5 {
		t.Fatalf("DecodeOut allocates %v times, want at most 5", n)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Run{Worker: "w", Slots: []int{1}, Attempts: []int{1}}.Encode())
	f.Add(Out{Worker: "w", OK: []OKSlot{{Slot: 1, Result: []byte("x")}}}.Encode())
	f.Add([]byte(`{"w":"x","s":[1],"a":[1]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := DecodeRun(b); err == nil && b[0] == formatV1 {
			// What reads from the binary form reads back the same.
			again, err := DecodeRun(v.Encode())
			if err != nil || !reflect.DeepEqual(again, v) {
				t.Fatalf("run %+v read back as %+v, %v", v, again, err)
			}
		}
		if o, err := DecodeOut(b); err == nil && b[0] == formatV1 {
			again, err := DecodeOut(o.Encode())
			if err != nil || !reflect.DeepEqual(again, o) {
				t.Fatalf("outcome %+v read back as %+v, %v", o, again, err)
			}
		}
	})
}
