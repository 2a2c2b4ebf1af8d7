package paxos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// seenList is a copy of t's memory of IDs, oldest first, as it is now.
// Never nil, so that a table that got empty and one that never remembered
// anything look alike. The caller holds mu, or is the table's only user.
func (t *Table) seenList() []tableSeen {
	return t.seen.view().results()
}

// TestSeenLog checks the log against a plain slice and map through
// pushes (new IDs and repeated ones), replaces and drops across chunk
// boundaries, with the hash whole and narrowed to 4 bits (so that most
// IDs share a hash with another), and that a view taken before them keeps
// what it saw.
func TestSeenLog(t *testing.T) {
	for _, mask := range []uint64{0, 0xF} {
		t.Run(fmt.Sprintf("mask=%#x", mask), func(t *testing.T) { checkSeenLog(t, mask) })
	}
}

func checkSeenLog(t *testing.T, mask uint64) {
	l := seenLog{mask: mask}
	var ref []tableSeen
	rng := rand.New(rand.NewPCG(3, 4))
	var views []seenView
	var wants [][]tableSeen
	latest := func(id string) (int, bool) { // ref's position of id's last push
		for i := len(ref) - 1; i >= 0; i-- {
			if ref[i].ID == id {
				return i, true
			}
		}
		return 0, false
	}
	id := func(step int) string { return fmt.Sprint("id-", rng.IntN(step+1)) }
	for step := 0; step < 20_000; step++ {
		switch r := rng.IntN(100); {
		case r < 70:
			s := tableSeen{ID: fmt.Sprint("id-", step), Time: int64(step), Index: uint64(step), Same: 3}
			if r < 5 { // an ID pushed again: the later result is found
				s.ID = id(step)
			}
			l.push(s)
			ref = append(ref, s)
		case r < 78:
			// An unknown ID changes nothing; a known one keeps its Time.
			s := tableSeen{ID: id(step), Code: CodeOK, Err: fmt.Sprint("replaced at ", step)}
			i, ok := latest(s.ID)
			if ok {
				s.Time = ref[i].Time
				ref = slices.Clone(ref)
				ref[i] = s
			}
			l.replace(s)
		case r < 93 && len(ref) > 0:
			before := ref[rng.IntN(min(len(ref), 3*byteChunkRecords/2))].Time
			n := l.dropWhile(func(at int64) bool { return at < before })
			k := 0
			for k < len(ref) && ref[k].Time < before {
				k++
			}
			if n != k {
				t.Fatalf("step %d: dropped %d, want %d", step, n, k)
			}
			ref = ref[k:]
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
		for range 3 {
			q := id(step)
			got, ok := l.find(q)
			i, want := latest(q)
			if ok != want || ok && got != ref[i] {
				t.Fatalf("step %d: find(%s) = %+v %v, want found %v", step, q, got, ok, want)
			}
		}
	}
	if len(views) < 10 {
		t.Fatalf("%d views: the test proves nothing", len(views))
	}
	if mask != 0 && len(l.clash) == 0 {
		t.Fatal("no ID shares a hash: the narrowed run proves nothing")
	}
	for k, v := range views {
		if got := v.results(); !slices.Equal(got, wants[k]) {
			t.Fatalf("view %d changed: %d results, want %d", k, len(got), len(wants[k]))
		}
	}
	if got := l.view().results(); !slices.Equal(got, ref) || got == nil {
		t.Fatalf("the log's view: %d results, want %d (never nil)", len(got), len(ref))
	}
}
