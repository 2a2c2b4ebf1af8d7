package cursor

import (
	"errors"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	c := Cursor{Digest: Digest("q", "PENDING"), Phase: "s", Index: 2, Key: "0900-0000000000000000001-abcdefgh", Slot: 17, Since: 5, Until: 9}
	got, err := Decode(Encode(c))
	if err != nil || got != c {
		t.Fatalf("Decode(Encode(%+v)) = %+v, %v", c, got, err)
	}
}

func TestMalformed(t *testing.T) {
	for _, s := range []string{"", "!!", "e30", Encode(Cursor{Phase: "s"}), "eyJ4IjoxfQ"} {
		if _, err := Decode(s); !errors.Is(err, ErrMalformed) {
			t.Errorf("Decode(%q) = %v, want ErrMalformed", s, err)
		}
	}
}

// TestOutOfRange: a cursor anyone wrote with an unknown phase or a
// negative index, slot or window is malformed.
func TestOutOfRange(t *testing.T) {
	for _, c := range []Cursor{
		{Digest: "d", Phase: "x"}, {Digest: "d", Phase: "r", Index: -1}, {Digest: "d", Phase: "s", Slot: -2},
		{Digest: "d", Phase: "s", Since: -5}, {Digest: "d", Phase: "s", Until: -1},
	} {
		if _, err := Decode(Encode(c)); !errors.Is(err, ErrMalformed) {
			t.Errorf("Decode(%+v) = %v, want ErrMalformed", c, err)
		}
	}
}

func TestDigestSeparatesParts(t *testing.T) {
	for _, pair := range [][2][]string{
		{{"ab", "c"}, {"a", "bc"}},
		{{"k=x\x00k2=y"}, {"k=x", "k2=y"}}, // a parameter value holding the old separator
		{{"a", ""}, {"a"}},
	} {
		if Digest(pair[0]...) == Digest(pair[1]...) {
			t.Errorf("Digest(%q) == Digest(%q): the digest must tell the parts apart", pair[0], pair[1])
		}
	}
}

func TestWindow(t *testing.T) {
	var c Cursor
	since := time.Date(2026, 11, 28, 9, 0, 0, 5, time.UTC)
	c.SetWindow(since, time.Time{})
	got, until := windowAfterCodec(t, c)
	if !got.Equal(since) || !until.IsZero() {
		t.Fatalf("window %v %v", got, until)
	}
}

// windowAfterCodec encodes c, decodes it and returns its window.
func windowAfterCodec(t *testing.T, c Cursor) (time.Time, time.Time) {
	t.Helper()
	c.Digest, c.Phase = "d", "s"
	back, err := Decode(Encode(c))
	if err != nil {
		t.Fatal(err)
	}
	return back.Window()
}
