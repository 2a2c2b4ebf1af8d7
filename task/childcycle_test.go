package task_test

import (
	"strings"
	"testing"

	"github.com/droverhq/drover/task"
)

// A child's id is never its parent's nor an ancestor's: along chains of
// 300 generations, from a short id and from one of the longest (where
// every id is cut and given a hash of its parent's), with positional and
// long keys, no id comes back, and each stays within task.MaxIDLen. A
// step waits only for the children it spawned, by these ids, so a wait
// on the task itself or an ancestor cannot arise; an id another task has
// (submitted by other means) is refused at the spawn (queue tests).
func TestChildIDIsNeverAnAncestors(t *testing.T) {
	for _, root := range []string{"p", strings.Repeat("r", task.MaxIDLen)} {
		for _, key := range []string{"0", "k", strings.Repeat("k", 60)} {
			seen := map[string]int{root: 0}
			cur := root
			for gen := 1; gen <= 300; gen++ {
				next := task.ChildID(cur, gen%7+1, key)
				if next == "" {
					break // no room for the key: the spawn is refused (planChildren)
				}
				if len(next) > task.MaxIDLen {
					t.Fatalf("generation %d: id %q is %d characters, over %d", gen, next, len(next), task.MaxIDLen)
				}
				if g, ok := seen[next]; ok {
					t.Fatalf("root %.10q, key %.10q: generation %d has the id of generation %d: %q", root, key, gen, g, next)
				}
				seen[next] = gen
				cur = next
			}
		}
	}
}
