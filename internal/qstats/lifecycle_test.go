package qstats

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestRecorderLifecycle: a Recorder's Stop is safe before Start and twice;
// a Start after Stop starts nothing; a started recorder's goroutine (its
// watch and its minute closer) has ended when Stop returns.
func TestRecorderLifecycle(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx := context.Background()

	unstarted, err := NewRecorder(Config{Client: cli, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := unstarted.Stop(ctx); err != nil {
			t.Fatalf("Stop before Start: %v", err)
		}
	}
	unstarted.Start(ctx)
	if err := running(); err != nil {
		t.Fatalf("Start after Stop started something: %v", err)
	}

	r, err := NewRecorder(Config{Client: cli, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	r.Start(ctx)
	r.Start(ctx)
	<-r.Ready()
	for range 2 {
		if err := r.Stop(ctx); err != nil {
			t.Fatalf("Stop: %v", err)
		}
	}
	if err := running(); err != nil {
		t.Fatalf("goroutines of a stopped recorder still run: %v", err)
	}
}

// running returns the stacks of the goroutines that run this package's
// code, other than the tests' own (nil: none).
func running() error {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var found []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/droverhq/drover/internal/qstats.") && !strings.Contains(g, "testing.tRunner") {
			found = append(found, g)
		}
	}
	if len(found) == 0 {
		return nil
	}
	return errors.New(strings.Join(found, "\n\n"))
}
