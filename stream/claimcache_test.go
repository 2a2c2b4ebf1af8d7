package stream_test

import (
	"fmt"
	"testing"

	"github.com/droverhq/drover/stream"
)

// A cached claim is answered to its session (Held) or to its token alone
// (Token), and forgotten on Forget.
func TestClaimCacheKeysAndSessions(t *testing.T) {
	t.Parallel()
	var c stream.ClaimCache
	k := stream.ClaimKey{NS: "ns", Task: "t1", Token: 7}
	if _, ok := c.Token(k); ok {
		t.Fatal("an empty cache answered a claim")
	}
	c.Put(k, "1a.secret", stream.Claim{Task: "t1", Attempt: 2})
	if cl, ok := c.Held(k, "1a.secret"); !ok || cl.Attempt != 2 {
		t.Fatalf("Held under the claim's session: %+v %v", cl, ok)
	}
	if _, ok := c.Held(k, "1a.other"); ok {
		t.Fatal("Held answered the claim to another session (another secret)")
	}
	for _, other := range []stream.ClaimKey{{NS: "ns2", Task: "t1", Token: 7}, {NS: "ns", Task: "t2", Token: 7}, {NS: "ns", Task: "t1", Token: 8}} {
		if _, ok := c.Token(other); ok {
			t.Fatalf("Token answered %+v with the claim of %+v", other, k)
		}
	}
	if cl, ok := c.Token(k); !ok || cl.Attempt != 2 {
		t.Fatalf("Token: %+v %v", cl, ok)
	}
	c.Forget(k)
	if _, ok := c.Token(k); ok {
		t.Fatal("a forgotten claim was answered")
	}
	var none *stream.ClaimCache
	none.Put(k, "s", stream.Claim{})
	if _, ok := none.Token(k); ok || none.Len() != 0 {
		t.Fatal("a nil cache kept a claim")
	}
}

// The cache holds at most MaxCachedClaims entries; one used lately stays
// while older ones go.
func TestClaimCacheBounded(t *testing.T) {
	t.Parallel()
	var c stream.ClaimCache
	key := func(i int) stream.ClaimKey { return stream.ClaimKey{NS: "ns", Task: fmt.Sprint("t", i), Token: 1} }
	hot := stream.ClaimKey{NS: "ns", Task: "hot", Token: 1}
	c.Put(hot, "s", stream.Claim{Task: "hot"})
	for i := range 3 * stream.MaxCachedClaims {
		c.Put(key(i), "s", stream.Claim{})
		if _, ok := c.Held(hot, "s"); !ok {
			t.Fatalf("the claim used after every put was dropped after %d puts", i+1)
		}
		if n := c.Len(); n > stream.MaxCachedClaims {
			t.Fatalf("%d entries after %d puts, want at most %d", n, i+1, stream.MaxCachedClaims)
		}
	}
	if _, ok := c.Token(key(0)); ok {
		t.Fatal("the oldest claim, unused, is still cached")
	}
	if _, ok := c.Token(key(3*stream.MaxCachedClaims - 1)); !ok {
		t.Fatal("the newest claim is not cached")
	}
}
