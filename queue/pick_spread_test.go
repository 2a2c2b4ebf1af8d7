package queue

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// TestPickSpreadsClaimsOverTheFirstSegments: a claim's candidates are the
// first severalMax open segments of the top level, in their order but
// starting at a random one of them and wrapping round, so that the claim
// loops of many workers start at different segments instead of racing for
// the first few (a run whose segment another loop claimed from since its
// read is refused whole). Over 400 claims every candidate list is such a
// rotation, and more than the four first segments start one.
func TestPickSpreadsClaimsOverTheFirstSegments(t *testing.T) {
	_, cli := etcdtest.StartOwn(t)
	c, err := NewClient(cli, "pick")
	if err != nil {
		t.Fatal(err)
	}
	w := newClaimer(c, "q", nil, "w1", slog.Default())
	pre := c.keys.SegmentsOpen("q")
	t0 := time.Unix(1_800_000_000, 0)
	var names []string
	var open []*mvccpb.KeyValue
	for i := range 24 {
		name := keyspace.SegmentName(100, t0.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("s%02d", i))
		names = append(names, name)
		open = append(open, &mvccpb.KeyValue{Key: []byte(pre + name)})
	}
	first := names[:severalMax]
	starts := map[string]bool{}
	for seq := int64(1); len(starts) < severalMax && seq <= 400; seq++ {
		if seq%8 == 0 {
			continue // a lower level's turn reads etcd: not what this tests
		}
		cands, err := w.pickSegments(context.Background(), open, false, false, seq)
		if err != nil {
			t.Fatal(err)
		}
		if len(cands) != severalMax {
			t.Fatalf("claim %d: %d candidates, want %d", seq, len(cands), severalMax)
		}
		k := -1
		for i, n := range first {
			if n == cands[0] {
				k = i
			}
		}
		if k < 0 {
			t.Fatalf("claim %d starts at %s, not one of the first %d segments", seq, cands[0], severalMax)
		}
		for i, n := range cands {
			if want := first[(k+i)%severalMax]; n != want {
				t.Fatalf("claim %d: candidate %d is %s, want %s (the first segments from %d on, wrapping round)", seq, i, n, want, k)
			}
		}
		starts[cands[0]] = true
	}
	if len(starts) <= 4 {
		t.Fatalf("claims started at %d different segments, want more than the first 4", len(starts))
	}
}
