package cursor

import (
	"errors"
	"testing"
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

func TestDigestSeparatesParts(t *testing.T) {
	if Digest("ab", "c") == Digest("a", "bc") {
		t.Fatal("digest must tell the parts apart")
	}
}
