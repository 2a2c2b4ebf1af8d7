package segcodec

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 24, 6, 30, 0, 123456789, time.UTC)
	runs := []Run{
		{Worker: "w-1", ClaimedAt: at, Slots: []int{0, 5, 99}, Attempts: []int{1, 2, 3}},
		{Worker: "", Slots: []int{}, Attempts: []int{}},
	}
	for _, v := range runs {
		got, err := DecodeRun(v.Encode())
		if err != nil || !reflect.DeepEqual(got, v) {
			t.Fatalf("run %+v: got %+v, %v", v, got, err)
		}
	}
	outs := []Out{
		{Worker: "w-2", Token: 1 << 40, ClaimedAt: at, FinishedAt: at.Add(time.Second),
			OK: []OKSlot{{Slot: 3, Attempt: 1, Result: []byte(`{"x":1}`)}, {Slot: 4, Attempt: 2}}, Moved: []int{7, 8}},
		{Worker: "w-3", Token: 5},
	}
	for _, o := range outs {
		got, err := DecodeOut(o.Encode())
		if err != nil || !reflect.DeepEqual(*got, o) {
			t.Fatalf("out %+v: got %+v, %v", o, got, err)
		}
	}
}

// Values written as JSON are still read.
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
}

// Every cut of a value, and a value of another format, is an error, never
// a panic or a value read wrong.
func TestRefusesDamagedValues(t *testing.T) {
	o := Out{Worker: "w", Token: 9, ClaimedAt: time.Unix(1, 0), OK: []OKSlot{{Slot: 1, Attempt: 1, Result: []byte("result")}}, Moved: []int{2}}
	b := o.Encode()
	for i := 0; i < len(b); i++ {
		if _, err := DecodeOut(b[:i]); err == nil {
			t.Fatalf("a value cut to %d of %d bytes was read", i, len(b))
		}
	}
	r := Run{Worker: "w", Slots: []int{1, 2}, Attempts: []int{1, 1}}.Encode()
	for i := 0; i < len(r); i++ {
		if _, err := DecodeRun(r[:i]); err == nil {
			t.Fatalf("a run cut to %d of %d bytes was read", i, len(r))
		}
	}
	if _, err := DecodeRun([]byte{0x7f, 1, 2}); err == nil {
		t.Fatal("a value of an unknown format was read")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Run{Worker: "w", Slots: []int{1}, Attempts: []int{1}}.Encode())
	f.Add(Out{Worker: "w", OK: []OKSlot{{Slot: 1, Result: []byte("x")}}}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = DecodeRun(b)
		_, _ = DecodeOut(b)
	})
}
