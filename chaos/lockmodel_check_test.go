package chaos

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// h builds a history from rows of (client, kind, token, result, call,
// return) on lock "a".
func h(rows ...[6]any) []porcupine.Operation {
	var ops []porcupine.Operation
	for _, r := range rows {
		ops = append(ops, porcupine.Operation{ClientId: r[0].(int),
			Input:  lockInput{Kind: r[1].(lockOpKind), Name: "a", Client: r[0].(int), Token: int64(r[2].(int))},
			Output: lockOutput{Result: r[3].(string)}, Call: int64(r[4].(int)), Return: int64(r[5].(int))})
	}
	return ops
}

// TestLockModelCatchesViolations feeds the checker histories that break
// each rule, and histories that are legal under faults, so that a checker
// that cannot fail would fail here.
func TestLockModelCatchesViolations(t *testing.T) {
	for _, c := range []struct {
		name string
		hist []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"two holders at once", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{2, opAcquire, 11, resOK, 2, 3},
			[6]any{1, opRelease, 10, resOK, 4, 5}), porcupine.Illegal},
		{"second holder before the first could have lost it", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{2, opAcquire, 11, resOK, 2, 3},
			[6]any{1, opExpirable, 0, resOK, 4, 4}), porcupine.Illegal},
		{"stale token accepted after a takeover", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{1, opExpirable, 0, resOK, 2, 2},
			[6]any{2, opAcquire, 11, resOK, 3, 4},
			[6]any{1, opWrite, 10, resOK, 5, 6}), porcupine.Illegal},
		{"write accepted from a client that never held", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{2, opWrite, 10, resOK, 2, 3}), porcupine.Illegal},
		{"token not increasing", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{1, opRelease, 10, resOK, 2, 3},
			[6]any{2, opAcquire, 9, resOK, 4, 5}), porcupine.Illegal},
		{"holder refused while it surely held", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{1, opWrite, 10, resRefused, 2, 3}), porcupine.Illegal},
		{"release by another client accepted", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{2, opRelease, 10, resOK, 2, 3}), porcupine.Illegal},
		{"takeover after the holder was paused", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{1, opExpirable, 0, resOK, 2, 2},
			[6]any{2, opAcquire, 11, resOK, 3, 4},
			[6]any{2, opWrite, 11, resOK, 5, 6},
			[6]any{1, opWrite, 10, resRefused, 7, 8},
			[6]any{1, opRelease, 10, resNotHeld, 9, 10},
			[6]any{2, opRelease, 11, resOK, 11, 12}), porcupine.Ok},
		{"concurrent acquisitions ordered by the release between", h(
			[6]any{1, opAcquire, 10, resOK, 0, 5},
			[6]any{2, opAcquire, 11, resOK, 1, 10},
			[6]any{1, opWrite, 10, resOK, 5, 6},
			[6]any{1, opRelease, 10, resOK, 6, 7},
			[6]any{2, opRelease, 11, resOK, 11, 12}), porcupine.Ok},
		{"ambiguous release, then the next holder", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{1, opRelease, 10, resAmbiguous, 2, 3},
			[6]any{2, opAcquire, 11, resOK, 4, 5}), porcupine.Ok},
		{"a write the client refused itself says nothing of the lock", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{1, opWrite, 10, resRefusedHere, 2, 3},
			[6]any{1, opRelease, 10, resOK, 4, 5}), porcupine.Ok},
		{"expirable names the token held", h(
			[6]any{1, opAcquire, 10, resOK, 0, 1},
			[6]any{1, opExpirable, 9, resOK, 2, 2},
			[6]any{2, opAcquire, 11, resOK, 3, 4}), porcupine.Illegal},
	} {
		t.Run(c.name, func(t *testing.T) {
			vs := checkLockHistory(c.hist, 10*time.Second)
			if len(vs) != 1 || vs[0].result != c.want {
				t.Fatalf("verdicts %+v, want %s", vs, c.want)
			}
			if c.want == porcupine.Illegal && vs[0].stuck == "" {
				t.Fatalf("an illegal history without a description of where it stops")
			}
		})
	}
}

// TestLockCheckPerName: a violation on one lock name is reported for that
// name, and the other names' histories are still checked.
func TestLockCheckPerName(t *testing.T) {
	bad := h([6]any{1, opAcquire, 10, resOK, 0, 1}, [6]any{2, opAcquire, 11, resOK, 2, 3})
	good := h([6]any{1, opAcquire, 10, resOK, 0, 1}, [6]any{1, opRelease, 10, resOK, 2, 3}, [6]any{2, opAcquire, 11, resOK, 4, 5})
	for i := range good {
		in := good[i].Input.(lockInput)
		in.Name = "b"
		good[i].Input = in
	}
	vs := checkLockHistory(append(bad, good...), 10*time.Second)
	if len(vs) != 2 || vs[0].name != "a" || vs[0].result != porcupine.Illegal || vs[1].name != "b" || vs[1].result != porcupine.Ok {
		t.Fatalf("verdicts %+v, want a Illegal and b Ok", vs)
	}
}
