package keyspace_test

import (
	"testing"

	"github.com/droverhq/drover/keyspace"
)

func TestChildKeysRoundTrip(t *testing.T) {
	s := keyspace.MustNew("ns")
	if k := s.ChildPlanChunk("p1", 3, 7); k != "/ns/tasks/p1/children/plan/000003/000007" {
		t.Errorf("plan chunk key %q", k)
	}
	step, k, ok := s.ParseChildPlanChunk("p1", s.ChildPlanChunk("p1", 3, 7))
	if !ok || step != 3 || k != 7 {
		t.Errorf("parsed %d %d %v", step, k, ok)
	}
	for _, bad := range []string{s.ChildSubmitted("p1", 3), s.ChildPlan("p1", 3) + "x", s.ChildPlanChunk("p2", 3, 7), s.ChildPlans("p1") + "000003/0000071"} {
		if _, _, ok := s.ParseChildPlanChunk("p1", bad); ok {
			t.Errorf("%q parsed as a plan chunk", bad)
		}
	}
	if k := s.ChildDone("p1", 2, "c.2.0"); k != "/ns/tasks/p1/children/done/000002/c.2.0" {
		t.Errorf("done key %q", k)
	}
	if k := s.ChildFailed("p1", 2, "c.2.0"); k != "/ns/tasks/p1/children/failed/000002/c.2.0" {
		t.Errorf("failed key %q", k)
	}
	// Every child key is under the parent's own prefix, which a purge
	// deletes.
	for _, k := range []string{s.ChildPlanChunk("p1", 1, 0), s.ChildSubmitted("p1", 1), s.ChildDone("p1", 1, "c"), s.ChildFailed("p1", 1, "c")} {
		if len(k) <= len(s.Task("p1")) || k[:len(s.Task("p1"))] != s.Task("p1") {
			t.Errorf("%q is not under %q", k, s.Task("p1"))
		}
	}
}
