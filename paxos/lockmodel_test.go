package paxos

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The porcupine model of one lock, with fencing: a grant's token exceeds
// every token granted before it on that lock, and only the holder, naming
// its token, can release or renew. TTLs in these histories are far longer
// than the run, so nothing expires; expiry and lock-delay are the table's
// unit tests' concern.

// lmInput is one call on a lock.
type lmInput struct {
	Op    Op
	Lock  string
	Owner string
	Token uint64
}

// lmOutput is what the call answered.
type lmOutput struct {
	Code  Code
	Owner string // the holder, for acquire (held) and get
	Token uint64
}

// lmState is a lock's state: its holder ("" when free), the holder's
// token, and the highest token ever granted.
type lmState struct {
	Holder string
	Token  uint64
	Floor  uint64
}

func lmStep(state, input, output any) (bool, any) {
	s, in, out := state.(lmState), input.(lmInput), output.(lmOutput)
	held := s.Holder != ""
	mine := held && s.Holder == in.Owner && s.Token == in.Token
	switch in.Op {
	case OpAcquire:
		switch out.Code {
		case CodeOK:
			if held || out.Token <= s.Floor {
				return false, s
			}
			return true, lmState{Holder: in.Owner, Token: out.Token, Floor: out.Token}
		case CodeHeld:
			return held && out.Owner == s.Holder && out.Token == s.Token, s
		}
	case OpRelease:
		switch out.Code {
		case CodeOK:
			if !mine {
				return false, s
			}
			return true, lmState{Floor: s.Floor}
		case CodeNotHeld:
			return !mine, s
		}
	case OpRenew:
		switch out.Code {
		case CodeOK:
			return mine, s
		case CodeNotHeld:
			return !mine, s
		}
	case OpGet:
		switch out.Code {
		case CodeOK:
			return held && out.Owner == s.Holder && out.Token == s.Token, s
		case CodeNotFound:
			return !held, s
		}
	}
	return false, s
}

// lockModel checks a history of lock operations, one partition per lock.
var lockModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byLock := map[string][]porcupine.Operation{}
		for _, op := range history {
			l := op.Input.(lmInput).Lock
			byLock[l] = append(byLock[l], op)
		}
		names := make([]string, 0, len(byLock))
		for n := range byLock {
			names = append(names, n)
		}
		sort.Strings(names)
		out := make([][]porcupine.Operation, 0, len(names))
		for _, n := range names {
			out = append(out, byLock[n])
		}
		return out
	},
	Init: func() any { return lmState{} },
	Step: lmStep,
	DescribeOperation: func(input, output any) string {
		in, out := input.(lmInput), output.(lmOutput)
		return fmt.Sprintf("%s(%s, %s, %d) -> %s %s %d", in.Op, in.Lock, in.Owner, in.Token, out.Code, out.Owner, out.Token)
	},
	DescribeState: func(state any) string {
		s := state.(lmState)
		return fmt.Sprintf("holder=%q token=%d floor=%d", s.Holder, s.Token, s.Floor)
	},
}

// history records operations from concurrent clients.
type history struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
}

func newHistory() *history { return &history{start: time.Now()} }

// now is the history's clock, in nanoseconds since it began.
func (h *history) now() int64 { return int64(time.Since(h.start)) }

// add records one completed operation.
func (h *history) add(client int, in lmInput, out lmOutput, call, ret int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret})
}

// check fails t unless the history is linearizable, and counts its
// operations and outcomes in the log.
func (h *history) check(t *testing.T, min int) {
	t.Helper()
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	counts := map[string]int{}
	grants := map[string]map[uint64]bool{}
	for _, op := range ops {
		in, out := op.Input.(lmInput), op.Output.(lmOutput)
		counts[string(in.Op)+"/"+string(out.Code)]++
		if in.Op == OpAcquire && out.Code == CodeOK {
			if grants[in.Lock] == nil {
				grants[in.Lock] = map[uint64]bool{}
			}
			if grants[in.Lock][out.Token] {
				t.Errorf("lock %s: token %d granted twice", in.Lock, out.Token)
			}
			grants[in.Lock][out.Token] = true
		}
	}
	t.Logf("history: %d operations %v", len(ops), counts)
	if len(ops) < min {
		t.Errorf("history has %d operations, want at least %d", len(ops), min)
	}
	res, info := porcupine.CheckOperationsVerbose(lockModel, ops, 5*time.Minute)
	if res != porcupine.Ok {
		path := t.TempDir() + "/history.html"
		if err := porcupine.VisualizePath(lockModel, info, path); err == nil {
			t.Logf("visualization: %s", path)
		}
		t.Fatalf("history of %d operations is not linearizable: %s", len(ops), res)
	}
}

// TestLockModelRefusesViolations shows the model is not vacuous: a double
// grant, a shrinking token and a release by a stale token are each
// refused.
func TestLockModelRefusesViolations(t *testing.T) {
	acq := func(owner string, call, ret int64, code Code, tok uint64, holder string) porcupine.Operation {
		return porcupine.Operation{Input: lmInput{Op: OpAcquire, Lock: "a", Owner: owner}, Call: call, Return: ret,
			Output: lmOutput{Code: code, Token: tok, Owner: holder}}
	}
	rel := func(owner string, tok uint64, call, ret int64, code Code) porcupine.Operation {
		return porcupine.Operation{Input: lmInput{Op: OpRelease, Lock: "a", Owner: owner, Token: tok}, Call: call, Return: ret,
			Output: lmOutput{Code: code}}
	}
	cases := []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"grant, release, grant", []porcupine.Operation{acq("x", 0, 1, CodeOK, 5, ""), rel("x", 5, 2, 3, CodeOK), acq("y", 4, 5, CodeOK, 9, "")}, true},
		{"two holders at once", []porcupine.Operation{acq("x", 0, 1, CodeOK, 5, ""), acq("y", 2, 3, CodeOK, 6, "")}, false},
		{"token goes down", []porcupine.Operation{acq("x", 0, 1, CodeOK, 5, ""), rel("x", 5, 2, 3, CodeOK), acq("y", 4, 5, CodeOK, 4, "")}, false},
		{"stale token releases", []porcupine.Operation{acq("x", 0, 1, CodeOK, 5, ""), rel("x", 4, 2, 3, CodeOK)}, false},
		{"concurrent grants ordered", []porcupine.Operation{acq("x", 0, 10, CodeOK, 5, ""), acq("y", 1, 11, CodeHeld, 5, "x")}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := porcupine.CheckOperations(lockModel, c.ops); got != c.ok {
				t.Fatalf("linearizable = %v, want %v", got, c.ok)
			}
		})
	}
}
