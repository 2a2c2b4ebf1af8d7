package chaos

import (
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// The porcupine model of a named lease lock with fencing tokens and a
// store fenced by the lock.
//
// A lease lock can end without a release: its lease expires. The model
// lets that happen only once the holder may have lost it: from the moment
// the holder was paused or killed (the test records it), or from the moment
// the holder's process saw the lock lost (its context ended with
// lock.ErrLost at its lease deadline). Such a moment is an opExpirable
// operation in the history; before it, the lock is the holder's alone, so a
// second holder is a violation. Expiry itself is lazy: an expirable lock is
// taken to have expired by the first operation that shows it (an
// acquisition by anyone, a refused write or release of the holder).
//
// The rules: an acquisition succeeds only on a free (or expirable) lock,
// with a token above every token issued before on that name; a fenced
// write is accepted only from the holder with its token, and refused from
// the holder only once its lock is expirable; a release succeeds only for
// the holder. A write the client refused itself (it knew its lease passed
// its deadline) says nothing of the lock. Operations whose outcome is unknown (an error) are left out
// of the history, except a release retried until it was certain the lock
// was gone (opRelease with resAmbiguous).

// lockOpKind is the kind of an operation on a lock.
type lockOpKind string

const (
	opAcquire      lockOpKind = "acquire"
	opWrite        lockOpKind = "write"
	opRelease      lockOpKind = "release"
	opExpirable    lockOpKind = "expirable" // the holder may have lost the lock from here on
	allTokens      int64      = 0           // an opExpirable for whatever the client holds
	resOK                     = "ok"
	resRefused                = "refused"      // a write the store refused
	resRefusedHere            = "refused-here" // a write its client refused itself: says nothing of the lock
	resNotHeld                = "notheld"      // a release of a lock not held
	resAmbiguous              = "ambiguous"    // a release that may have applied; the lock is not held after it
)

// lockInput is one operation: its kind, lock name, client, and the token
// (the one granted, for an acquisition).
type lockInput struct {
	Kind   lockOpKind
	Name   string
	Client int
	Token  int64
}

// lockOutput is what the operation returned.
type lockOutput struct{ Result string }

// lockState is one lock's state: its holder (-1 when free) and the
// holder's token, whether it may have expired, and the highest token
// issued.
type lockState struct {
	Holder    int
	Token     int64
	Expirable bool
	Floor     int64
}

// free is the state after the lock ends, keeping the token floor.
func (s lockState) free() lockState { return lockState{Holder: -1, Floor: s.Floor} }

// lockStep is the model's step function.
func lockStep(state, input, output any) (bool, any) {
	s, in, out := state.(lockState), input.(lockInput), output.(lockOutput)
	mine := s.Holder == in.Client && s.Token == in.Token
	switch in.Kind {
	case opAcquire:
		if (s.Holder >= 0 && !s.Expirable) || in.Token <= s.Floor {
			return false, s
		}
		return true, lockState{Holder: in.Client, Token: in.Token, Floor: in.Token}
	case opWrite:
		switch out.Result {
		case resOK:
			return mine, s
		case resRefusedHere:
			return true, s
		}
		return gone(s, mine)
	case opRelease:
		switch out.Result {
		case resOK:
			return mine, s.free()
		case resAmbiguous:
			if mine {
				return true, s.free()
			}
			return true, s
		}
		return gone(s, mine)
	case opExpirable:
		if s.Holder == in.Client && (in.Token == allTokens || s.Token == in.Token) {
			s.Expirable = true
		}
		return true, s
	}
	return false, s
}

// gone is the step of a write or release its holder was refused: legal
// when the caller does not hold the lock, or when its lock may have expired
// (and then it has).
func gone(s lockState, mine bool) (bool, any) {
	switch {
	case !mine:
		return true, s
	case s.Expirable:
		return true, s.free()
	}
	return false, s
}

// lockModel is the porcupine model, partitioned by lock name.
var lockModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range h {
			n := op.Input.(lockInput).Name
			if _, ok := by[n]; !ok {
				names = append(names, n)
			}
			by[n] = append(by[n], op)
		}
		slices.Sort(names)
		out := make([][]porcupine.Operation, 0, len(names))
		for _, n := range names {
			out = append(out, by[n])
		}
		return out
	},
	Init:  func() any { return lockState{Holder: -1} },
	Step:  lockStep,
	Equal: func(a, b any) bool { return a.(lockState) == b.(lockState) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(lockInput), output.(lockOutput)
		return fmt.Sprintf("c%d %s %s t%d -> %s", in.Client, in.Kind, in.Name, in.Token, out.Result)
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		if s.Holder < 0 {
			return fmt.Sprintf("free (floor %d)", s.Floor)
		}
		return fmt.Sprintf("c%d t%d expirable=%t", s.Holder, s.Token, s.Expirable)
	},
}

// lockVerdict is porcupine's verdict on one lock name's history.
type lockVerdict struct {
	name   string
	ops    int
	result porcupine.CheckResult
	info   porcupine.LinearizationInfo
	// stuck describes where the check stopped: the last operation of the
	// longest partial linearization and the one it could not take next
	// (the earliest-returning one left out), which is stuckOp.
	stuck   string
	stuckOp porcupine.Operation
}

// checkLockHistory checks each lock name's history on its own, so that a
// violation on one name does not hide the others, within timeout each.
func checkLockHistory(h []porcupine.Operation, timeout time.Duration) []lockVerdict {
	var out []lockVerdict
	for _, part := range lockModel.Partition(h) {
		m := lockModel
		m.Partition = nil
		res, info := porcupine.CheckOperationsVerbose(m, part, timeout)
		v := lockVerdict{name: part[0].Input.(lockInput).Name, ops: len(part), result: res, info: info}
		if res == porcupine.Illegal {
			v.stuck, v.stuckOp = stuckAt(part, info)
		}
		out = append(out, v)
	}
	return out
}

// stuckAt describes where the longest partial linearization of an illegal
// history ends: its last operation and the operation it could not take.
func stuckAt(h []porcupine.Operation, info porcupine.LinearizationInfo) (string, porcupine.Operation) {
	var longest []int
	for _, p := range info.PartialLinearizations() {
		for _, l := range p {
			if len(l) > len(longest) {
				longest = l
			}
		}
	}
	in := map[int]bool{}
	for _, id := range longest {
		in[id] = true
	}
	next := -1
	for id, op := range h {
		if !in[id] && (next < 0 || op.Return < h[next].Return) {
			next = id
		}
	}
	desc := func(id int) string {
		op := h[id]
		return lockModel.DescribeOperation(op.Input, op.Output) + fmt.Sprintf(" [%d, %d]", op.Call, op.Return)
	}
	s := fmt.Sprintf("%d of %d operations linearized", len(longest), len(h))
	if len(longest) > 0 {
		s += "; last: " + desc(longest[len(longest)-1])
	}
	if next < 0 {
		return s, porcupine.Operation{}
	}
	return s + "; cannot take: " + desc(next), h[next]
}
