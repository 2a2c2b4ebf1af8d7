package schedule_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/schedule"
)

// TestRunnerLifecycle: a Runner's Stop is safe before Start and twice; a
// Start after Stop starts nothing; a started runner's goroutines (its due
// indexes, the namespaces' watch) all end once Stop returns (each may
// still be leaving, past its deferred Done, when it does).
func TestRunnerLifecycle(t *testing.T) {
	c, _, _ := newClient(t)
	ctx := context.Background()

	unstarted := &schedule.Runner{Client: c}
	unstarted.Stop()
	unstarted.Stop()
	unstarted.Start(ctx) // after Stop: nothing starts
	unstarted.Stop()

	for _, all := range []bool{false, true} {
		r := &schedule.Runner{Client: c, AllNamespaces: all}
		r.Start(ctx)
		r.Start(ctx) // again: nothing more starts
		r.Stop()
		r.Stop()
		if err := running(); err != nil {
			t.Fatalf("goroutines of a stopped runner (all namespaces %v) still run: %v", all, err)
		}
	}
}

// running returns the stacks of the goroutines that run this package's
// code, other than the tests' own (nil: none). A goroutine whose deferred
// wg.Done has let Stop return may still be on its way out, runnable: it is
// looked for again, for at most 10 s, before it counts.
func running() error {
	var err error
	for i := 0; i < 1000; i++ {
		if err = runningNow(); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// runningNow is running's one look at the goroutines' stacks.
func runningNow() error {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var found []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/droverhq/drover/schedule.") && !strings.Contains(g, "testing.tRunner") {
			found = append(found, g)
		}
	}
	if len(found) == 0 {
		return nil
	}
	return errors.New(strings.Join(found, "\n\n"))
}
