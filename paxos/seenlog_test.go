package paxos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// flatten is a view's results in one slice, never nil.
func flatten(view [][]tableSeen) []tableSeen {
	if out := slices.Concat(view...); out != nil {
		return out
	}
	return []tableSeen{}
}

// seenList is a copy of t's memory of IDs, oldest first, as it is now.
// Never nil, so that a table that got empty and one that never remembered
// anything look alike. The caller holds mu, or is the table's only user.
func (t *Table) seenList() []tableSeen {
	return flatten(t.seen.view())
}

// TestSeenLog checks the chunked log against a plain slice through
// pushes, sets and drops across chunk boundaries, and that a view taken
// before them keeps what it saw.
func TestSeenLog(t *testing.T) {
	var l seenLog
	var ref []tableSeen
	rng := rand.New(rand.NewPCG(3, 4))
	var views [][][]tableSeen
	var wants [][]tableSeen
	for step := 0; step < 30_000; step++ {
		switch r := rng.IntN(100); {
		case r < 70:
			s := tableSeen{ID: fmt.Sprint(step), Time: int64(step)}
			l.push(s)
			ref = append(ref, s)
		case r < 80 && len(ref) > 0:
			i := rng.IntN(len(ref))
			s := tableSeen{ID: fmt.Sprint("set", step)}
			l.set(i, s)
			ref = slices.Clone(ref)
			ref[i] = s
		case r < 95 && len(ref) > 0:
			n := rng.IntN(min(len(ref), 3*seenChunk/2) + 1)
			l.drop(n)
			ref = ref[n:]
		default:
			views = append(views, l.view())
			wants = append(wants, slices.Clone(ref))
		}
		if l.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", step, l.len(), len(ref))
		}
		if len(ref) > 0 {
			if i := rng.IntN(len(ref)); l.at(i) != ref[i] {
				t.Fatalf("step %d: at(%d) = %+v, want %+v", step, i, l.at(i), ref[i])
			}
		}
	}
	if len(views) < 10 {
		t.Fatalf("%d views: the test proves nothing", len(views))
	}
	for k, v := range views {
		if got := flatten(v); !slices.Equal(got, wants[k]) {
			t.Fatalf("view %d changed: %d results, want %d", k, len(got), len(wants[k]))
		}
	}
	if got := flatten(l.view()); !slices.Equal(got, ref) || got == nil {
		t.Fatalf("the log's view: %d results, want %d (never nil)", len(got), len(ref))
	}
}
