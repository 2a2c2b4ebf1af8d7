package task

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover"
)

// MaxSleepYears bounds how far ahead a sleep may end.
const MaxSleepYears = 100

// SleepRequest is what a step returns as its error to end with a sleep:
// the state it returns with it is checkpointed as the step's, with the
// time the sleep ends, and the task's next step runs no earlier than that.
// Make one with Sleep or SleepUntil.
//
// A run that meets a sleep stops after the step's checkpoint and lets the
// task go: a Runner releases its lock (Run returns with
// Result.SleepingUntil set), a queue worker parks the task on its queue's
// due index, with no claim, no lease and no worker slot, until any worker
// resumes it at that time. A run that loads a checkpoint whose sleep has
// not ended runs nothing. A sleep from the last step ends nothing: the
// task completes at once.
type SleepRequest struct {
	// For is how long to sleep, from when the step ended; Until, when
	// set, is when the sleep ends instead.
	For   time.Duration
	Until time.Time
	until bool
}

// Sleep ends a step with a sleep of d before the next step. d must not be
// negative; 0 sleeps not at all.
func Sleep(d time.Duration) error { return &SleepRequest{For: d} }

// SleepUntil ends a step with a sleep until t before the next step; a time
// already past sleeps not at all.
func SleepUntil(t time.Time) error { return &SleepRequest{Until: t, until: true} }

// Error implements error: a sleep request that reaches a caller which does
// not park tasks reads as what it is.
func (r *SleepRequest) Error() string {
	if r.until {
		return "task: step asks to sleep until " + r.Until.Format(time.RFC3339Nano)
	}
	return "task: step asks to sleep for " + r.For.String()
}

// Due returns when the sleep ends, counted from now: a negative duration,
// a zero Until, or an end more than MaxSleepYears ahead is a
// *drover.InputError naming "sleep".
func (r *SleepRequest) Due(now time.Time) (time.Time, error) {
	var at time.Time
	switch {
	case r.until && r.Until.IsZero():
		return time.Time{}, &drover.InputError{Field: "sleep until", Rule: "must be set: the time the sleep ends"}
	case r.until:
		at = r.Until
	case r.For < 0:
		return time.Time{}, &drover.InputError{Field: "sleep", Value: r.For.String(), Rule: "must not be negative"}
	default:
		at = now.Add(r.For)
	}
	if at.After(now.AddDate(MaxSleepYears, 0, 0)) {
		return time.Time{}, &drover.InputError{Field: "sleep", Value: at.Format(time.RFC3339), Rule: fmt.Sprintf("must end at most %d years from now", MaxSleepYears)}
	}
	return at.UTC(), nil
}

// sleepOf returns the sleep request err is or wraps, if any.
func sleepOf(err error) (*SleepRequest, bool) {
	var r *SleepRequest
	ok := errors.As(err, &r)
	return r, ok
}

// ParseSleep reads a sleep as text, for the HTTP API, the clients and exec
// steps: a duration ("90s", "10m", "1h30m", or a number of seconds) or an
// RFC 3339 time with its zone ("2026-12-01T09:00:00Z",
// "2026-12-01T10:00:00+01:00"). field names the input in the error.
func ParseSleep(field, s string) (*SleepRequest, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, &drover.InputError{Field: field, Rule: "must be a duration such as 10m or an RFC 3339 time with a zone such as 2026-12-01T09:00:00Z"}
	}
	if len(s) >= 5 && s[4] == '-' && strings.Trim(s[:4], "0123456789") == "" { // a date
		return parseSleepTime(field, s)
	}
	if secs, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(secs) && !math.IsInf(secs, 0) {
		if secs < 0 {
			return nil, &drover.InputError{Field: field, Value: s, Rule: "must not be negative"}
		}
		if secs > float64(MaxSleepYears)*366*24*3600 {
			return nil, &drover.InputError{Field: field, Value: s, Rule: fmt.Sprintf("must end at most %d years from now", MaxSleepYears)}
		}
		return &SleepRequest{For: time.Duration(secs * float64(time.Second))}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, &drover.InputError{Field: field, Value: s, Rule: "must be a duration such as 10m or 1.5s, or an RFC 3339 time with a zone such as 2026-12-01T09:00:00Z"}
	}
	if d < 0 {
		return nil, &drover.InputError{Field: field, Value: s, Rule: "must not be negative"}
	}
	return &SleepRequest{For: d}, nil
}

// parseSleepTime reads an RFC 3339 time that must carry its zone.
func parseSleepTime(field, s string) (*SleepRequest, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		if _, lerr := time.Parse("2006-01-02T15:04:05.999999999", s); lerr == nil {
			return nil, &drover.InputError{Field: field, Value: s, Rule: "must give its time zone (Z or an offset such as +01:00): a time without one could mean any instant"}
		}
		return nil, &drover.InputError{Field: field, Value: s, Rule: "must be an RFC 3339 time with a zone such as 2026-12-01T09:00:00Z, or a duration such as 10m"}
	}
	return &SleepRequest{Until: t, until: true}, nil
}

// SleepMargin is how near its end a checkpoint's sleep may be for a run
// that finds it to wait in-process rather than let the task go: clocks
// that differ by less than this do not make a task that was moved back
// to pending on one clock park again on another.
const SleepMargin = 5 * time.Second

// WaitNearSleep waits, on a real timer, for a sleep that ends at until
// on now's clock and ends within SleepMargin, and reports true: the run
// may go on. A sleep that has ended reports true at once; one further
// off reports false, without waiting. It returns ctx's error if ctx ends
// first.
func WaitNearSleep(ctx context.Context, until time.Time, now func() time.Time) (bool, error) {
	left := until.Sub(now())
	switch {
	case left <= 0:
		return true, nil
	case left > SleepMargin:
		return false, nil
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, context.Cause(ctx)
	case <-t.C:
		return true, nil
	}
}
