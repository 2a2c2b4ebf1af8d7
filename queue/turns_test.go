package queue

import (
	"slices"
	"testing"
)

// TestLevelTurns: the anti-starvation rule over the levels of open
// segments. With levels 0 (highest priority), 500 and 1000 all busy with
// work, of 64 claims 56 take the top level and the 8 lower turns alternate
// between 500 and 1000; with one level every claim takes it; a lower turn
// that finds nothing below starts again below the top.
func TestLevelTurns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		levels []int
		want   map[int]int // level → claims out of 64
	}{
		{"three levels", []int{0, 500, 1000}, map[int]int{0: 56, 500: 4, 1000: 4}},
		{"two levels", []int{300, 700}, map[int]int{300: 56, 700: 8}},
		{"one level", []int{42}, map[int]int{42: 64}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lt levelTurns
			got := map[int]int{}
			var lowerOrder []int
			for seq := int64(1); seq <= 64; seq++ {
				top := tc.levels[0]
				from, lower := lt.from(seq, top)
				if !lower {
					got[top]++
					continue
				}
				// The read from level from finds the first level at or
				// after it, as a range read of the open segments does.
				// A turn that finds nothing reads once more from below
				// the top, as pickSegments does.
				lv := top
				for try := 0; try < 2; try++ {
					i, _ := slices.BinarySearch(tc.levels, from)
					found := i < len(tc.levels)
					if found {
						lv = tc.levels[i]
						lowerOrder = append(lowerOrder, lv)
					}
					lt.took(lv, found, top)
					if found || from == top+1 {
						break
					}
					from = top + 1
				}
				got[lv]++
			}
			for lv, n := range tc.want {
				if got[lv] != n {
					t.Fatalf("level %d took %d of 64 claims, want %d (all %v; lower turns %v)", lv, got[lv], n, got, lowerOrder)
				}
			}
			for i := 1; i < len(lowerOrder); i++ {
				if len(tc.levels) > 2 && lowerOrder[i] == lowerOrder[i-1] {
					t.Fatalf("lower turns did not alternate: %v", lowerOrder)
				}
			}
		})
	}
}

// TestLowerTurn: the same rule among the levels of tasks with records of
// their own. With open levels, highest first, 56 of 64 claims read the
// top one and the 8 lower turns go round the levels below it, each within
// 8*(open-1) claims; with one level every claim reads it.
func TestLowerTurn(t *testing.T) {
	for _, tc := range []struct {
		open int
		want []int // claims of 64 per index
	}{
		{1, []int{64}},
		{2, []int{56, 8}},
		{3, []int{56, 4, 4}},
		{5, []int{56, 2, 2, 2, 2}},
	} {
		got := make([]int, tc.open)
		last := make([]int64, tc.open)
		for seq := int64(1); seq <= 64; seq++ {
			i := lowerTurn(tc.open, seq)
			if i < 0 || i >= tc.open {
				t.Fatalf("open %d, claim %d: index %d out of range", tc.open, seq, i)
			}
			got[i]++
			if i > 0 && last[i] > 0 && seq-last[i] > int64(8*(tc.open-1)) {
				t.Fatalf("open %d: level %d read at claims %d and %d, over %d apart", tc.open, i, last[i], seq, 8*(tc.open-1))
			}
			last[i] = seq
		}
		if !slices.Equal(got, tc.want) {
			t.Fatalf("open %d: claims per level %v, want %v", tc.open, got, tc.want)
		}
	}
}
