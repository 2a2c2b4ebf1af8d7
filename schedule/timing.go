package schedule

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	_ "time/tzdata" // time zones on machines without them
)

// parser reads the standard five fields and the descriptors (@daily...).
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// fieldNames are the five fields of a cron expression, in order.
var fieldNames = [5]string{"minute", "hour", "day-of-month", "month", "day-of-week"}

// timing is when a schedule's ticks fall: next returns the first tick
// after t.
type timing interface {
	next(t time.Time) time.Time
}

// every ticks at each multiple of d since the Unix epoch.
type every time.Duration

func (e every) next(t time.Time) time.Time {
	d := int64(e)
	n := t.UnixNano()
	k := n / d
	if n < 0 && n%d != 0 {
		k--
	}
	return time.Unix(0, (k+1)*d).UTC()
}

// cronTiming is a parsed cron expression in its time zone.
type cronTiming struct{ s cron.Schedule }

func (c cronTiming) next(t time.Time) time.Time { return c.s.Next(t).UTC() }

// timing checks the schedule's Cron, TZ and Every and returns its ticks.
func (s Schedule) timing() (timing, error) {
	switch {
	case s.Cron != "" && s.Every != 0:
		return nil, inputErr("every", time.Duration(s.Every).String(), "give cron or every, not both")
	case s.Every != 0:
		if s.TZ != "" {
			return nil, inputErr("tz", s.TZ, "goes with cron: every counts from the Unix epoch")
		}
		d := time.Duration(s.Every)
		if d < MinEvery || d%time.Second != 0 {
			return nil, inputErr("every", d.String(), "must be a whole number of seconds, 1s or more")
		}
		if time.Duration(s.Jitter) >= d {
			return nil, inputErr("jitter", time.Duration(s.Jitter).String(), "must be below every ("+d.String()+")")
		}
		return every(d), nil
	case s.Cron == "":
		return nil, inputErr("cron", s.Cron, "give cron (such as \"0 9 * * MON-FRI\") or every (such as 30s)")
	}
	return parseCron(s.Cron, s.TZ)
}

// parseCron reads a cron expression, in time zone tz ("": UTC, unless expr
// starts with CRON_TZ=ZONE). An expression that does not read gives a
// drover.InputError naming the field and its position.
func parseCron(expr, tz string) (timing, error) {
	expr = strings.TrimSpace(expr)
	if zone, rest, ok := cutZone(expr); ok {
		if tz != "" && tz != zone {
			return nil, inputErr("tz", tz, fmt.Sprintf("differs from the expression's CRON_TZ=%s; give one", zone))
		}
		tz, expr = zone, rest
	}
	if tz == "" {
		tz = "UTC"
	}
	if _, err := time.LoadLocation(tz); err != nil || strings.EqualFold(tz, "local") {
		return nil, inputErr("tz", tz, "must be an IANA time zone such as Europe/Paris or UTC")
	}
	fields := strings.Fields(expr)
	switch {
	case len(fields) == 0:
		return nil, inputErr("cron", expr, "must be five fields (minute hour day-of-month month day-of-week) or a descriptor such as @daily")
	case strings.HasPrefix(fields[0], "@every"):
		return nil, inputErr("cron", expr, "@every is not a cron tick; give every (such as --every 30s) instead")
	case strings.HasPrefix(fields[0], "@"):
		if len(fields) != 1 {
			return nil, inputErr("cron", expr, "a descriptor stands alone")
		}
	case len(fields) != 5:
		return nil, inputErr("cron", expr, fmt.Sprintf("must be five fields (minute hour day-of-month month day-of-week), not %d", len(fields)))
	default:
		for i, f := range fields {
			probe := []string{"*", "*", "*", "*", "*"}
			probe[i] = f
			if _, err := parser.Parse(strings.Join(probe, " ")); err != nil {
				return nil, inputErr("cron", expr, fmt.Sprintf("field %d (%s) %q does not read: %v", i+1, fieldNames[i], f, err))
			}
		}
	}
	sch, err := parser.Parse("CRON_TZ=" + tz + " " + strings.Join(fields, " "))
	if err != nil {
		return nil, inputErr("cron", expr, fmt.Sprintf("does not read: %v; use five fields or @yearly, @monthly, @weekly, @daily, @hourly", err))
	}
	return cronTiming{sch}, nil
}

// cutZone splits "CRON_TZ=Zone rest" (or "TZ=Zone rest").
func cutZone(expr string) (zone, rest string, ok bool) {
	for _, p := range []string{"CRON_TZ=", "TZ="} {
		if after, found := strings.CutPrefix(expr, p); found {
			zone, rest, _ = strings.Cut(after, " ")
			return zone, strings.TrimSpace(rest), true
		}
	}
	return "", expr, false
}

// jitterProbe is how many ticks of a cron minGap reads.
const jitterProbe = 64

// minGap is the shortest gap between the n ticks of tm after t.
func minGap(tm timing, t time.Time, n int) time.Duration {
	gap := time.Duration(1<<63 - 1)
	prev := tm.next(t)
	for i := 1; i < n && !prev.IsZero(); i++ {
		next := tm.next(prev)
		if next.IsZero() {
			break
		}
		gap = min(gap, next.Sub(prev))
		prev = next
	}
	return gap
}

// jitterOf is the delay of schedule name's tick at nominal: below jitter,
// the same on every server.
func jitterOf(name string, nominal time.Time, jitter time.Duration) time.Duration {
	if jitter <= 0 {
		return 0
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%d", name, nominal.UnixNano())
	return time.Duration(h.Sum64() % uint64(jitter))
}

// TaskID is the id of the task that schedule name's tick at nominal
// submits: the same on every server, so that a tick submitted twice is
// a duplicate.
func TaskID(name string, nominal time.Time) string {
	return name + "-" + nominal.UTC().Format("20060102T150405Z")
}

// manualID is the id of the task that a trigger at t submits: its time
// and a random part, so that two triggers in one second submit two tasks
// (a schedule name of MaxNameLen makes an id of 128 characters).
func manualID(name string, t time.Time) string {
	return fmt.Sprintf("%s-manual-%s-%05x", name, t.UTC().Format("060102T150405Z"), rand.Uint32()&0xfffff)
}
