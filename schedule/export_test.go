package schedule

import "time"

// Plan is decide for tests: the tick fired (zero: none) and the next.
func Plan(s Schedule, nominal time.Time, hold bool, now time.Time) (fire, next time.Time, err error) {
	s = s.withDefaults()
	tm, err := s.timing()
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	p := decide(s, tm, nominal, hold, now)
	return p.fire, p.next, nil
}

// Next is the first tick of s after t.
func Next(s Schedule, t time.Time) (time.Time, error) {
	tm, err := s.timing()
	if err != nil {
		return time.Time{}, err
	}
	return tm.next(t), nil
}

// Abort is abort for tests.
var Abort = abort

// SetAfterSubmit makes r call f after each submission, before its move.
func SetAfterSubmit(r *Runner, f func()) { r.afterSubmit = f }
