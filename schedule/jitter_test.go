package schedule

import (
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/queue"
)

// TestCronJitterBelowTheGap: a cron's jitter must be below the shortest
// gap between its ticks (an hour's jitter on every 5 minutes dropped ticks
// with no outage); below it, a day's ticks all fire.
func TestCronJitterBelowTheGap(t *testing.T) {
	s := Schedule{Name: "j", Cron: "*/5 * * * *", Queue: "q", Type: "t", Jitter: queue.Duration(time.Hour)}.withDefaults()
	var ie *drover.InputError
	if err := s.Validate(); !errors.As(err, &ie) || ie.Field != "jitter" {
		t.Fatalf("jitter 1h on */5: %v, want an error naming jitter", err)
	}
	s.Jitter = queue.Duration(5 * time.Minute)
	if err := s.Validate(); !errors.As(err, &ie) || ie.Field != "jitter" {
		t.Fatalf("jitter 5m on */5: %v, want an error naming jitter", err)
	}
	if err := (Schedule{Name: "w", Cron: "0 9 * * MON-FRI", Queue: "q", Type: "t", Jitter: queue.Duration(20 * time.Hour)}.withDefaults()).Validate(); err != nil {
		t.Fatalf("jitter 20h on weekdays at 9: %v", err)
	}
	for _, cu := range []Catchup{Latest, None} {
		s.Catchup, s.Jitter = cu, queue.Duration(4*time.Minute+59*time.Second)
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		tm, _ := s.timing()
		start := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
		nominal, fires := tm.next(start), 0
		for {
			at := nominal.Add(jitterOf(s.Name, nominal, time.Duration(s.Jitter)))
			if at.After(start.Add(24 * time.Hour)) {
				break
			}
			p := decide(s, tm, nominal, false, at) // moved exactly when due
			if !p.fire.IsZero() {
				fires++
			}
			nominal = p.next
		}
		if fires != 287 { // 00:05 to 23:55
			t.Errorf("%s: %d of 287 ticks fired with no outage", cu, fires)
		}
	}
}
