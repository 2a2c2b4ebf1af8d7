package schedule

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
)

// Overlap says what a tick does while the task of the previous fire has
// not finished (is SCHEDULED, PENDING, RUNNING or RETRYING).
type Overlap string

// The overlap policies.
const (
	// Skip does not fire the tick; its history says SKIPPED.
	Skip Overlap = "skip"
	// Allow fires the tick whatever the previous task does.
	Allow Overlap = "allow"
	// BufferOne holds the tick and fires it once the previous task has
	// finished; the ticks that pass meanwhile are dropped.
	BufferOne Overlap = "buffer-one"
	// CancelPrevious cancels the previous task, then fires.
	CancelPrevious Overlap = "cancel-previous"
)

// Catchup says which ticks fire that were missed while no server ran the
// schedule (or it could not submit).
type Catchup string

// The catch-up policies.
const (
	// None fires no missed tick: a tick more than OnTime late is dropped
	// and the schedule goes on with the next one to come.
	None Catchup = "none"
	// Latest fires the latest missed tick within the catch-up window.
	Latest Catchup = "latest"
	// All fires every missed tick within the catch-up window, in order
	// (at most MaxCatchup of them, the latest).
	All Catchup = "all"
)

// Limits and defaults.
const (
	// DefaultCatchupWindow is the catch-up window of a schedule that
	// gives none.
	DefaultCatchupWindow = time.Hour
	// MaxCatchupWindow bounds the catch-up window.
	MaxCatchupWindow = 7 * 24 * time.Hour
	// MaxCatchup bounds how many missed ticks policy All fires.
	MaxCatchup = 1000
	// OnTime is how late a tick may fire under catch-up policy None.
	OnTime = 10 * time.Second
	// MinEvery is the shortest interval of an Every schedule.
	MinEvery = time.Second
	// MaxJitter bounds a schedule's jitter.
	MaxJitter = 24 * time.Hour
	// MaxNameLen bounds a schedule's name: its tasks' ids add up to 28
	// characters to it.
	MaxNameLen = 100
	// MaxHistory is how many fires a schedule's history keeps.
	MaxHistory = 1000
)

var (
	// ErrExists: a schedule of that name exists already.
	ErrExists = errors.New("schedule: already exists")
	// ErrNotFound: no schedule of that name.
	ErrNotFound = errors.New("schedule: not found")
)

// Schedule is a schedule as its user gives it: when it fires (Cron, with
// TZ, or Every) and the task each fire submits. NextFireAt is drover's,
// set when a schedule is read.
type Schedule struct {
	Name string `json:"name"`
	// Cron is a cron expression: five fields (minute, hour, day of month,
	// month, day of week) or a descriptor such as @daily. Give Cron or
	// Every.
	Cron string `json:"cron,omitempty"`
	// TZ is the IANA time zone Cron is read in ("": UTC).
	TZ string `json:"tz,omitempty"`
	// Every fires at each multiple of it since the Unix epoch: a whole
	// number of seconds, 1s or more.
	Every  queue.Duration  `json:"every,omitempty"`
	Queue  string          `json:"queue"`
	Type   string          `json:"type"`
	Params json.RawMessage `json:"params,omitempty"`
	// Overlap: "" is Skip.
	Overlap Overlap `json:"overlap"`
	// Catchup: "" is Latest.
	Catchup Catchup `json:"catchup"`
	// CatchupWindow: 0 is DefaultCatchupWindow.
	CatchupWindow queue.Duration `json:"catchup_window"`
	// Jitter delays each fire by a duration below it, the same for a
	// given schedule and tick on every server.
	Jitter queue.Duration `json:"jitter,omitempty"`
	Paused bool           `json:"paused"`
	// NextFireAt is when the schedule fires next (jitter included); zero
	// while paused.
	NextFireAt time.Time `json:"next_fire_at,omitzero"`
}

// withDefaults returns s with its zero values replaced by the defaults.
func (s Schedule) withDefaults() Schedule {
	if s.Overlap == "" {
		s.Overlap = Skip
	}
	if s.Catchup == "" {
		s.Catchup = Latest
	}
	if s.CatchupWindow == 0 {
		s.CatchupWindow = queue.Duration(DefaultCatchupWindow)
	}
	if len(s.Params) == 0 || string(s.Params) == "null" {
		s.Params = nil
	}
	return s
}

func inputErr(field string, value any, rule string) error {
	return &drover.InputError{Field: field, Value: value, Rule: rule}
}

// Validate checks s (with its defaults) and returns a drover.InputError
// naming the first field that is wrong.
func (s Schedule) Validate() error {
	if err := keyspace.CheckName("name", s.Name); err != nil {
		return err
	}
	if len(s.Name) > MaxNameLen {
		return inputErr("name", s.Name, fmt.Sprintf("must be at most %d characters: its tasks' ids add a time to it", MaxNameLen))
	}
	tm, err := s.timing()
	if err != nil {
		return err
	}
	if _, ok := tm.(cronTiming); ok && s.Jitter > 0 {
		// A jitter as long as the gap to the next tick delays a tick
		// past it: the plan then drops ticks with no outage.
		if gap := minGap(tm, time.Now(), jitterProbe); time.Duration(s.Jitter) >= gap {
			return inputErr("jitter", time.Duration(s.Jitter).String(), "must be below the shortest gap between the cron's ticks ("+gap.String()+")")
		}
	}
	if err := queue.CheckQueue(s.Queue); err != nil {
		return err
	}
	if s.Type == "" {
		return inputErr("type", s.Type, "must be the task type each fire submits")
	}
	if len(s.Params) > 0 && !json.Valid(s.Params) {
		return inputErr("params", string(s.Params), "must be a JSON value")
	}
	if len(s.Params) > queue.MaxPayload {
		return inputErr("params", fmt.Sprintf("%d bytes", len(s.Params)), fmt.Sprintf("must be at most %d bytes", queue.MaxPayload))
	}
	switch s.Overlap {
	case "", Skip, Allow, BufferOne, CancelPrevious:
	default:
		return inputErr("overlap", string(s.Overlap), "must be skip, allow, buffer-one or cancel-previous")
	}
	switch s.Catchup {
	case "", None, Latest, All:
	default:
		return inputErr("catchup", string(s.Catchup), "must be none, latest or all")
	}
	if w := time.Duration(s.CatchupWindow); w < 0 || (w > 0 && w < time.Second) || w > MaxCatchupWindow {
		return inputErr("catchup_window", w.String(), "must be a duration from 1s to 168h (0: 1h)")
	}
	if j := time.Duration(s.Jitter); j < 0 || j > MaxJitter {
		return inputErr("jitter", j.String(), "must be a duration from 0 to 24h")
	}
	t := queue.Task{ID: s.Name, Type: s.Type, Parameters: s.Params}
	if err := t.Validate(); err != nil {
		var ie *drover.InputError
		if errors.As(err, &ie) {
			switch ie.Field {
			case "task_type":
				return ie.Renamed("type")
			case "parameters":
				return ie.Renamed("params")
			}
		}
		return err
	}
	return nil
}
