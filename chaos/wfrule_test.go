package chaos

import (
	"testing"
	"time"
)

// TestWorkflowRerunRule checks the rule the workflow chaos tests judge
// runs by, on made-up runs: a run again is excused only when the earlier
// run's outcome was not stored, a fault ended it before the next run
// started, and the next run has a higher attempt; a run after the stored
// one is a double run; a server kill excuses only the runs in flight at
// it.
func TestWorkflowRerunRule(t *testing.T) {
	at := func(ms int64) time.Time { return time.Unix(0, ms*int64(time.Millisecond)) }
	ns := func(ms int64) int64 { return ms * int64(time.Millisecond) }
	kill := func(ms int64, pid int) fault { return fault{kind: faultWorkerKill, at: at(ms), pids: []int{pid}} }
	server := fault{kind: faultServerKill, at: at(150)}
	rows := []struct {
		name              string
		runs              []*attempt
		stored            int
		faults            []fault
		excused, problems int
		double            int
	}{
		{"one run", []*attempt{{n: 1, pid: 1, start: ns(100)}}, 0, nil, 0, 0, 0},
		{"killed, run again", []*attempt{{n: 1, pid: 1, start: ns(100)}, {n: 2, pid: 2, start: ns(300)}}, 1, []fault{kill(200, 1)}, 1, 0, 0},
		{"no fault", []*attempt{{n: 1, pid: 1, start: ns(100)}, {n: 2, pid: 2, start: ns(300)}}, 1, nil, 0, 1, 0},
		{"fault on another process", []*attempt{{n: 1, pid: 1, start: ns(100)}, {n: 2, pid: 2, start: ns(300)}}, 1, []fault{kill(200, 3)}, 0, 1, 0},
		{"fault after the next run started", []*attempt{{n: 1, pid: 1, start: ns(100)}, {n: 2, pid: 2, start: ns(300)}}, 1, []fault{kill(400, 1)}, 0, 1, 0},
		{"fault before the run", []*attempt{{n: 1, pid: 1, start: ns(100)}, {n: 2, pid: 2, start: ns(300)}}, 1, []fault{kill(50, 1)}, 0, 1, 0},
		{"same attempt again", []*attempt{{n: 2, pid: 1, start: ns(100)}, {n: 2, pid: 2, start: ns(300)}}, 1, []fault{kill(200, 1)}, 0, 1, 0},
		{"run after the stored one", []*attempt{{n: 1, pid: 1, start: ns(100)}, {n: 2, pid: 2, start: ns(300)}}, 0, []fault{kill(200, 1)}, 0, 1, 1},
		{"stored from no run", []*attempt{{n: 1, pid: 1, start: ns(100)}}, -1, nil, 0, 1, 0},
		{"in flight at a server kill", []*attempt{{n: 1, pid: 1, start: ns(100)}, {n: 2, pid: 1, start: ns(300)}}, 1, []fault{server}, 1, 0, 0},
		{"done before a server kill", []*attempt{{n: 1, pid: 1, start: ns(100), end: ns(120)}, {n: 2, pid: 1, start: ns(300)}}, 1, []fault{server}, 0, 1, 0},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			r := &wfRun{t: t, faults: row.faults}
			var c wfCounts
			excused := r.judgeRuns("p-000/plan", row.runs, row.stored, &c)
			if excused != row.excused || len(c.problems) != row.problems || c.doubleRuns != row.double {
				t.Fatalf("excused %d, double runs %d, problems %v; want %d, %d, %d problems", excused, c.doubleRuns, c.problems, row.excused, row.double, row.problems)
			}
		})
	}
}
