package schedule_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newClient(t *testing.T) (*schedule.Client, *clientv3.Client, string) {
	t.Helper()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	c, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	return c, cli, ns
}

func TestCronErrorsNameFieldAndPosition(t *testing.T) {
	for _, tc := range []struct{ name, cron, want string }{
		{"minute", "61 * * * *", "field 1 (minute)"},
		{"hour", "0 25 * * *", "field 2 (hour)"},
		{"day of month", "0 0 32 * *", "field 3 (day-of-month)"},
		{"month", "0 0 * FOO *", "field 4 (month)"},
		{"day of week", "0 9 * * MON-XYZ", "field 5 (day-of-week)"},
		{"too few", "0 9 *", "five fields"},
		{"descriptor", "@sometimes", "descriptor"},
		{"every", "@every 5m", "every"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := schedule.Schedule{Name: "s", Cron: tc.cron, Queue: "q", Type: "t"}.Validate()
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != "cron" || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("cron %q: %v, want an error on cron naming %q", tc.cron, err, tc.want)
			}
		})
	}
	for _, ok := range []string{"0 9 * * MON-FRI", "*/5 * * * *", "@daily", "@hourly", "CRON_TZ=Asia/Tokyo 0 9 * * *"} {
		if err := (schedule.Schedule{Name: "s", Cron: ok, Queue: "q", Type: "t"}).Validate(); err != nil {
			t.Errorf("cron %q: %v", ok, err)
		}
	}
}

func TestBadInputStoresNothing(t *testing.T) {
	c, cli, ns := newClient(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		s     schedule.Schedule
		field string
	}{
		{"unknown zone", schedule.Schedule{Name: "a", Cron: "0 9 * * *", TZ: "Mars/Olympus", Queue: "q", Type: "t"}, "tz"},
		{"every below 1s", schedule.Schedule{Name: "a", Every: queue.Duration(500 * time.Millisecond), Queue: "q", Type: "t"}, "every"},
		{"cron and every", schedule.Schedule{Name: "a", Cron: "@daily", Every: queue.Duration(time.Minute), Queue: "q", Type: "t"}, "every"},
		{"bad queue", schedule.Schedule{Name: "a", Every: queue.Duration(time.Second), Queue: "no/slash", Type: "t"}, "queue"},
		{"bad name", schedule.Schedule{Name: "a b", Every: queue.Duration(time.Second), Queue: "q", Type: "t"}, "name"},
		{"bad overlap", schedule.Schedule{Name: "a", Every: queue.Duration(time.Second), Queue: "q", Type: "t", Overlap: "sometimes"}, "overlap"},
		{"bad catchup", schedule.Schedule{Name: "a", Every: queue.Duration(time.Second), Queue: "q", Type: "t", Catchup: "some"}, "catchup"},
		{"bad params", schedule.Schedule{Name: "a", Every: queue.Duration(time.Second), Queue: "q", Type: "t", Params: []byte("{")}, "params"},
		{"jitter over every", schedule.Schedule{Name: "a", Every: queue.Duration(time.Second), Queue: "q", Type: "t", Jitter: queue.Duration(2 * time.Second)}, "jitter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Create(ctx, tc.s)
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != tc.field {
				t.Fatalf("got %v, want an InputError on %s", err, tc.field)
			}
		})
	}
	g, err := cli.Get(ctx, "/"+ns+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != 0 {
		t.Fatalf("stored %d keys (%v), want none", g.Count, err)
	}
	s := schedule.Schedule{Name: "dup", Every: queue.Duration(time.Hour), Queue: "q", Type: "t"}
	if _, err := c.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	s.Type = "other"
	if _, err := c.Create(ctx, s); !errors.Is(err, schedule.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	if got, _ := c.Get(ctx, "dup"); got.Type != "t" {
		t.Fatalf("the second create changed the first: %+v", got)
	}
}

func TestCronTimeZoneCarriesDST(t *testing.T) {
	s := schedule.Schedule{Name: "s", Cron: "0 9 * * *", TZ: "Europe/Paris", Queue: "q", Type: "t"}
	for _, tc := range []struct{ after, want string }{
		{"2026-03-28T12:00:00Z", "2026-03-29T07:00:00Z"}, // the first day of summer time: 09:00 CEST
		{"2026-03-27T12:00:00Z", "2026-03-28T08:00:00Z"}, // 09:00 CET
		{"2026-10-24T12:00:00Z", "2026-10-25T08:00:00Z"}, // back to CET
	} {
		after, _ := time.Parse(time.RFC3339, tc.after)
		got, err := schedule.Next(s, after)
		if err != nil || got.Format(time.RFC3339) != tc.want {
			t.Errorf("after %s: %v %v, want %s", tc.after, got, err, tc.want)
		}
	}
	// robfig/cron skips a local time that does not exist (02:30 on the
	// spring gap) and fires once a time that happens twice (autumn).
	s.Cron = "30 2 * * *"
	for _, tc := range []struct{ after, want string }{
		{"2026-03-28T12:00:00Z", "2026-03-30T00:30:00Z"},
		{"2026-10-24T12:00:00Z", "2026-10-25T00:30:00Z"},
		{"2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"}, // and again, an hour later
	} {
		after, _ := time.Parse(time.RFC3339, tc.after)
		got, err := schedule.Next(s, after)
		if err != nil || got.Format(time.RFC3339) != tc.want {
			t.Errorf("02:30 after %s: %v %v, want %s", tc.after, got, err, tc.want)
		}
	}
}

func TestCatchupPolicies(t *testing.T) {
	base := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	every := schedule.Schedule{Name: "s", Every: queue.Duration(time.Minute), Queue: "q", Type: "t"}
	at := func(m int) time.Time { return base.Add(time.Duration(m) * time.Minute) }
	for _, tc := range []struct {
		name       string
		catchup    schedule.Catchup
		window     time.Duration
		nominal    time.Time
		now        time.Time
		fire, next time.Time
	}{
		{"on time", schedule.Latest, 0, at(0), at(0).Add(time.Millisecond), at(0), at(1)},
		{"latest after a gap", schedule.Latest, 0, at(0), at(30).Add(time.Second), at(30), at(31)},
		{"latest beyond the window", schedule.Latest, 10 * time.Minute, at(0), at(30).Add(time.Second), at(30), at(31)},
		{"all fires the first missed", schedule.All, 0, at(0), at(30).Add(time.Second), at(0), at(1)},
		{"all within the window", schedule.All, 10 * time.Minute, at(0), at(30).Add(time.Second), at(21), at(22)},
		{"none fires on time", schedule.None, 0, at(0), at(0).Add(2 * time.Second), at(0), at(1)},
		{"none skips a missed tick", schedule.None, 0, at(0), at(30).Add(20 * time.Second), time.Time{}, at(31)},
		{"nothing passed yet", schedule.Latest, 0, at(5), at(4), time.Time{}, at(5)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := every
			s.Catchup, s.CatchupWindow = tc.catchup, queue.Duration(tc.window)
			fire, next, err := schedule.Plan(s, tc.nominal, false, tc.now)
			if err != nil || !fire.Equal(tc.fire) || !next.Equal(tc.next) {
				t.Fatalf("fire %v next %v (%v), want %v %v", fire, next, err, tc.fire, tc.next)
			}
		})
	}
	// All fires each missed tick in turn, then waits.
	s := every
	s.Catchup = schedule.All
	nominal, now, fired := at(0), at(5).Add(time.Second), 0
	for {
		fire, next, _ := schedule.Plan(s, nominal, false, now)
		if fire.IsZero() {
			break
		}
		if !fire.Equal(at(fired)) {
			t.Fatalf("fire %d: %v, want %v", fired, fire, at(fired))
		}
		fired++
		nominal = next
	}
	if fired != 6 || !nominal.Equal(at(6)) {
		t.Fatalf("all fired %d ticks and waits for %v, want 6 and %v", fired, nominal, at(6))
	}
	// A held tick fires as it is.
	if fire, next, _ := schedule.Plan(every, at(0), true, at(3)); !fire.Equal(at(0)) || !next.Equal(at(4)) {
		t.Fatalf("held: %v %v", fire, next)
	}
}
