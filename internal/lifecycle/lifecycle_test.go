package lifecycle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartStop(t *testing.T) {
	t.Parallel()
	var l Lifecycle
	var runs atomic.Int32
	cause := make(chan error, 1)
	run := func(ctx context.Context) {
		runs.Add(1)
		<-ctx.Done()
		cause <- context.Cause(ctx)
	}
	if !l.Start(context.Background(), run) {
		t.Fatal("first Start did not start")
	}
	if l.Start(context.Background(), run) {
		t.Fatal("second Start started again")
	}
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-cause; !errors.Is(err, ErrStopped) {
		t.Fatalf("run's context cause = %v, want ErrStopped", err)
	}
	if err := l.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if l.Start(context.Background(), run) {
		t.Fatal("Start after Stop started")
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("run ran %d times, want 1", n)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
}

func TestStopBeforeStart(t *testing.T) {
	t.Parallel()
	var l Lifecycle
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l.Start(context.Background(), func(context.Context) { t.Error("ran after Stop") }) {
		t.Fatal("Start after Stop started")
	}
	<-l.Done()
}

func TestRunEndsByItself(t *testing.T) {
	t.Parallel()
	var l Lifecycle
	l.Start(context.Background(), func(context.Context) {})
	<-l.Done()
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A run that does not end in time makes Stop report the wait's end, and
// a later Stop still waits for the same end.
func TestStopBoundedByItsContext(t *testing.T) {
	t.Parallel()
	var l Lifecycle
	release := make(chan struct{})
	l.Start(context.Background(), func(context.Context) { <-release })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Stop(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop with an ended context = %v, want context.Canceled", err)
	}
	close(release)
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestParentContextEndsRun(t *testing.T) {
	t.Parallel()
	var l Lifecycle
	ctx, cancel := context.WithCancel(context.Background())
	l.Start(ctx, func(ctx context.Context) { <-ctx.Done() })
	cancel()
	<-l.Done()
	if err := l.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSleep(t *testing.T) {
	t.Parallel()
	if err := Sleep(context.Background(), time.Microsecond); err != nil {
		t.Fatalf("a finished sleep = %v", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("told to stop")
	cancel(stop)
	// An hour's sleep on an ended context returns at once with its cause.
	if err := Sleep(ctx, time.Hour); !errors.Is(err, stop) {
		t.Fatalf("Sleep on an ended context = %v, want its cause", err)
	}
	if err := Sleep(ctx, 0); !errors.Is(err, stop) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep(0) on an ended context = %v, want its cause and context.Canceled", err)
	}
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on a cancelled context = %v, want it to match context.Canceled", err)
	}
	if err := Sleep(context.Background(), 0); err != nil {
		t.Fatalf("Sleep(0) on a live context = %v", err)
	}
}

// Stop on a Lifecycle whose run has ended, or that never started, reports
// no error even when its own context has ended too (a select between two
// ready cases would pick either).
func TestStopAfterTheEndWithAnEndedContext(t *testing.T) {
	t.Parallel()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 200 {
		var never Lifecycle
		if err := never.Stop(ended); err != nil {
			t.Fatalf("try %d: Stop of a never-started Lifecycle = %v", i, err)
		}
		var finished Lifecycle
		finished.Start(context.Background(), func(context.Context) {})
		<-finished.Done()
		if err := finished.Stop(ended); err != nil {
			t.Fatalf("try %d: Stop of a finished Lifecycle = %v", i, err)
		}
	}
}
