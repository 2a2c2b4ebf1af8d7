package task_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A runner's step that sleeps: Run returns with SleepingUntil and the lock
// released; a Run before the sleep ends (on the runner's clock) runs
// nothing, one after resumes at the next step, on another runner; each
// step runs once.
func TestRunnerStepSleeps(t *testing.T) {
	ns := etcdtest.Namespace(t)
	var clock atomic.Int64
	clock.Store(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	runs := map[string]int{}
	steps := []task.Step{
		{Name: "plan", Run: func(_ context.Context, s []byte) ([]byte, error) {
			runs["plan"]++
			return append(s, 'p'), task.SleepUntil(now().Add(time.Hour))
		}},
		{Name: "poll", Run: func(_ context.Context, s []byte) ([]byte, error) {
			runs["poll"]++
			return append(s, 'q'), task.Sleep(10 * time.Minute)
		}},
		{Name: "report", Run: func(_ context.Context, s []byte) ([]byte, error) {
			runs["report"]++
			return append(s, 'r'), task.Sleep(time.Hour) // nothing follows: it completes
		}},
	}
	runner := func(worker string) *task.Runner {
		r, err := task.NewRunner(context.Background(), srv.Client(t), task.RunnerConfig{Namespace: ns, WorkerID: worker, TTL: 5 * time.Second, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close(context.Background()) })
		return r
	}
	a, b := runner("a"), runner("b")
	ctx := context.Background()
	res, err := a.Run(ctx, "nap", steps)
	wantUntil := now().Add(time.Hour)
	if err != nil || !res.SleepingUntil.Equal(wantUntil) || res.StepsRun != 1 {
		t.Fatalf("first run: %+v, %v: want step 1 run and a sleep until %s", res, err, wantUntil)
	}
	cli := srv.Client(t)
	if g, _ := cli.Get(ctx, keyspace.MustNew(ns).Lock(keyspace.TaskLock("nap")), clientv3.WithPrefix(), clientv3.WithCountOnly()); g.Count != 0 {
		t.Fatalf("%d lock keys held while the task sleeps", g.Count)
	}
	clock.Add(int64(time.Hour - task.SleepMargin - time.Nanosecond))
	if res, err = b.Run(ctx, "nap", steps); err != nil || res.StepsRun != 0 || !res.SleepingUntil.Equal(wantUntil) {
		t.Fatalf("run SleepMargin and 1 ns early: %+v, %v: want nothing run", res, err)
	}
	clock.Add(int64(task.SleepMargin + 1))
	if res, err = b.Run(ctx, "nap", steps); err != nil || res.StepsRun != 1 || res.ResumedFrom != 2 || !res.SleepingUntil.Equal(now().Add(10*time.Minute)) {
		t.Fatalf("run at the due time: %+v, %v: want step 2 run and a 10 min sleep", res, err)
	}
	clock.Add(int64(10 * time.Minute))
	if res, err = a.Run(ctx, "nap", steps); err != nil || !res.SleepingUntil.IsZero() || string(res.State) != "pqr" {
		t.Fatalf("last run: %+v, %v: want the task completed", res, err)
	}
	if runs["plan"] != 1 || runs["poll"] != 1 || runs["report"] != 1 {
		t.Fatalf("steps ran %v, want each once", runs)
	}
	cp, _ := a.Store().Load(ctx, "nap")
	if !cp.Completed || !cp.SleepUntil.IsZero() {
		t.Fatalf("checkpoint %+v: want completed, no sleep", cp)
	}
}

// A bad sleep fails its step with an input error naming it; nothing is
// checkpointed.
func TestRunnerBadSleep(t *testing.T) {
	ns := etcdtest.Namespace(t)
	r := newRunner(t, ns, "w", 5*time.Second, nil)
	for _, tc := range []struct {
		name string
		req  error
		want string
	}{
		{"negative", task.Sleep(-time.Second), "must not be negative"},
		{"zero time", task.SleepUntil(time.Time{}), "must be set"},
		{"too far", task.Sleep(101 * 366 * 24 * time.Hour), "at most 100 years"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "bad-" + tc.name[:3]
			_, err := r.Run(context.Background(), id, []task.Step{
				{Name: "one", Run: func(context.Context, []byte) ([]byte, error) { return []byte("x"), tc.req }},
				{Name: "two", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }},
			})
			var ie *drover.InputError
			if !errors.As(err, &ie) || !errors.Is(err, task.ErrStepFailed) || !strings.HasPrefix(ie.Field, "sleep") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v: want a step failure naming the sleep and %q", err, tc.want)
			}
			if cp, _ := r.Store().Load(context.Background(), id); cp.Step != 0 {
				t.Fatalf("checkpoint %+v written", cp)
			}
		})
	}
}

// ParseSleep reads durations, seconds and zoned times, and refuses a time
// without its zone, a negative duration and text that is neither.
func TestParseSleep(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		err  string
	}{
		{"10m", now.Add(10 * time.Minute), ""},
		{"1.5", now.Add(1500 * time.Millisecond), ""},
		{"2026-12-01T09:00:00+01:00", time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC), ""},
		{"2026-12-01T09:00:00", time.Time{}, "zone"},
		{"-5s", time.Time{}, "must not be negative"},
		{"-5", time.Time{}, "must not be negative"},
		{"soon", time.Time{}, "duration such as 10m"},
		{"NaN", time.Time{}, "duration such as 10m"},
		{"Inf", time.Time{}, "duration such as 10m"},
		{"", time.Time{}, "duration such as 10m"},
	} {
		r, err := task.ParseSleep("sleep", tc.in)
		var got time.Time
		if err == nil {
			got, err = r.Due(now)
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "sleep") {
				t.Errorf("%q: err %v, want one with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("%q: %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

// FuzzParseSleep: any text is read or refused with an input error naming
// the field, never a panic, and a sleep read never ends before now.
func FuzzParseSleep(f *testing.F) {
	for _, s := range []string{"10m", "1.5", "2026-12-01T09:00:00Z", "2026-12-01T09:00:00", "-1s", "NaN", "1e300", ""} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		r, err := task.ParseSleep("sleep", s)
		if err == nil {
			var until time.Time
			if until, err = r.Due(now); err == nil && r.Until.IsZero() && until.Before(now) {
				t.Fatalf("%q: a duration that ends at %s, before now", s, until)
			}
		}
		var ie *drover.InputError
		if err != nil && (!errors.As(err, &ie) || !strings.HasPrefix(ie.Field, "sleep")) {
			t.Fatalf("%q: %v is not an input error naming the sleep", s, err)
		}
	})
}
