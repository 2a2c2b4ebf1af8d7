package keyspace

import (
	"fmt"
	"strconv"
	"strings"
)

// A step task's children live under its own prefix, so that whatever
// removes the parent's keys (a purge, the retention sweep) removes them
// too, and a task without children has none:
//
//	/{ns}/tasks/{p}/children/plan/{step:06d}/{chunk:06d} the children step {step} spawned, as a JSON array, in chunks
//	/{ns}/tasks/{p}/children/submitted/{step:06d}         every child of the step's plan was submitted
//	/{ns}/tasks/{p}/children/sealed                       p ended CANCELLED or DEAD: no child of it may be submitted
//	/{ns}/tasks/{p}/children/done/{step:06d}/{child}      a child's terminal outcome: status, result or error
//	/{ns}/tasks/{p}/children/failed/{step:06d}/{child}    a child that ended DEAD or CANCELLED (empty)
//	/{ns}/child-wakes/{q}/{p}                              a child of p (of queue q) ended: p's wait may be over
//	/{ns}/child-cascades/{q}/{p}                           p (of queue q) ended CANCELLED or DEAD: its live children are to be cancelled
//
// Step numbers are zero-padded so that keys sort in step order.

// TaskChildren is the prefix of task parent's child keys, ending in "/".
func (s Space) TaskChildren(parent string) string { return s.Task(parent) + "children/" }

// ChildPlans is the prefix of every plan chunk of task parent, ending in
// "/".
func (s Space) ChildPlans(parent string) string { return s.TaskChildren(parent) + "plan/" }

// ChildPlan is the prefix of the plan chunks of the children that step
// step of task parent spawned, ending in "/".
func (s Space) ChildPlan(parent string, step int) string {
	return fmt.Sprintf("%s%06d/", s.ChildPlans(parent), step)
}

// ChildPlanChunk is the key of chunk k (0-based) of step step's plan.
func (s Space) ChildPlanChunk(parent string, step, k int) string {
	return fmt.Sprintf("%s%06d", s.ChildPlan(parent, step), k)
}

// ParseChildPlanChunk reads a plan chunk's key of task parent: its step
// and chunk; false when key is not one.
func (s Space) ParseChildPlanChunk(parent, key string) (step, k int, ok bool) {
	rest, ok := strings.CutPrefix(key, s.ChildPlans(parent))
	if !ok {
		return 0, 0, false
	}
	a, b, ok := strings.Cut(rest, "/")
	if !ok || len(a) != 6 || len(b) != 6 {
		return 0, 0, false
	}
	step, err1 := strconv.Atoi(a)
	k, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || step < 0 || k < 0 {
		return 0, 0, false
	}
	return step, k, true
}

// ChildSubmitted is the key that says every child step step of task
// parent spawned was submitted.
func (s Space) ChildSubmitted(parent string, step int) string {
	return fmt.Sprintf("%ssubmitted/%06d", s.TaskChildren(parent), step)
}

// ChildSealed is the key that says task parent ended CANCELLED or DEAD
// with children planned: a submission of its children is refused from
// then on (until a requeue removes it), so that none submitted late, by
// a process that lost its claim, outlives its cascade.
func (s Space) ChildSealed(parent string) string { return s.TaskChildren(parent) + "sealed" }

// ChildDones is the prefix of the outcomes of the children step step of
// task parent spawned, ending in "/".
func (s Space) ChildDones(parent string, step int) string {
	return fmt.Sprintf("%sdone/%06d/", s.TaskChildren(parent), step)
}

// ChildDone is the key of child's terminal outcome.
func (s Space) ChildDone(parent string, step int, child string) string {
	return s.ChildDones(parent, step) + child
}

// ChildFaileds is the prefix of the children of step step of task parent
// that ended DEAD or CANCELLED, ending in "/".
func (s Space) ChildFaileds(parent string, step int) string {
	return fmt.Sprintf("%sfailed/%06d/", s.TaskChildren(parent), step)
}

// ChildFailed is the key that says child ended DEAD or CANCELLED.
func (s Space) ChildFailed(parent string, step int, child string) string {
	return s.ChildFaileds(parent, step) + child
}

// ChildWakes is the prefix of the wake marks of queue q's parents, ending
// in "/": outside the queue's prefix, so that the queue's watchers are not
// sent them.
func (s Space) ChildWakes(q string) string { return s.root + "child-wakes/" + q + "/" }

// ChildWake is the key that says a child of task parent, of queue q,
// ended since the mark was last handled.
func (s Space) ChildWake(q, parent string) string { return s.ChildWakes(q) + parent }

// ChildCascades is the prefix of the cascade marks of queue q's tasks,
// ending in "/": outside the queue's prefix, as the wake marks are.
func (s Space) ChildCascades(q string) string { return s.root + "child-cascades/" + q + "/" }

// ChildCascadesAll is the prefix of the cascade marks of every queue's
// tasks, ending in "/": each is {q}/{id} under it.
func (s Space) ChildCascadesAll() string { return s.root + "child-cascades/" }

// ChildCascade is the key that says task parent, of queue q, ended
// CANCELLED or DEAD with children spawned, and its live children may not
// all be cancelled yet.
func (s Space) ChildCascade(q, parent string) string { return s.ChildCascades(q) + parent }
