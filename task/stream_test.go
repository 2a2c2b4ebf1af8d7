package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
)

// emitting wraps steps so that each emits a token event every 5 ms while
// it runs (as a model's output comes), printing "EMITTED worker" once its
// first event is stored and "FENCED worker" when an emit is refused.
func emitting(steps []task.Step, worker string, outMu *sync.Mutex) []task.Step {
	say := func(s string) {
		outMu.Lock()
		fmt.Println(s)
		outMu.Unlock()
	}
	out := make([]task.Step, len(steps))
	for i, s := range steps {
		out[i] = task.Step{Name: s.Name, Run: func(ctx context.Context, state []byte) ([]byte, error) {
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for n := 0; ; n++ {
					err := stream.Token(ctx, fmt.Sprintf("%s-%s-%d ", worker, s.Name, n))
					if err == nil && n == 0 {
						if err = stream.Flush(ctx); err == nil {
							say("EMITTED " + worker)
						}
					}
					if err != nil {
						say(fmt.Sprintf("FENCED %s %t", worker, errors.Is(err, stream.ErrFenced)))
						return
					}
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
			}()
			st, err := s.Run(ctx, state)
			close(stop)
			<-done
			return st, err
		}}
	}
	return out
}

// readStream reads task id's whole stream in namespace ns.
func readStream(t *testing.T, ns, id string) []stream.Event {
	t.Helper()
	var evs []stream.Event
	err := stream.HubFor(srv.Client(t), keyspace.MustNew(ns)).Read(context.Background(), id, 1, func(list []stream.Event) bool {
		evs = append(evs, list...)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func types(evs []stream.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

func TestRunnerStepsEmit(t *testing.T) {
	ns := etcdtest.Namespace(t)
	r := newRunner(t, ns, "w1", 5*time.Second, nil)
	step := func(text string) task.Step {
		return task.Step{Name: text, Run: func(ctx context.Context, state []byte) ([]byte, error) {
			if err := stream.Token(ctx, text); err != nil {
				return nil, err
			}
			return append(state, text...), stream.Emit(ctx, "progress", map[string]string{"step": text})
		}}
	}
	steps := []task.Step{step("a"), step("b"), step("c")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := r.Run(ctx, "chat", steps); err != nil {
		t.Fatal(err)
	}
	evs := readStream(t, ns, "chat")
	want := []string{"attempt_started", "token", "progress", "token", "progress", "token", "progress", "done"}
	if fmt.Sprint(types(evs)) != fmt.Sprint(want) {
		t.Fatalf("stream = %v, want %v", types(evs), want)
	}
	var d struct {
		Outcome string `json:"outcome"`
	}
	if err := json.Unmarshal(evs[len(evs)-1].Data, &d); err != nil || d.Outcome != "succeeded" || string(evs[1].Data) != `{"text":"a"}` {
		t.Fatalf("done = %s (%v), first token = %s", evs[len(evs)-1].Data, err, evs[1].Data)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) || ev.Attempt != 1 {
			t.Fatalf("event %d = %+v, want seq %d of attempt 1", i, ev, i+1)
		}
	}
	// Run again: already completed, nothing is written.
	if res, err := r.Run(ctx, "chat", steps); err != nil || !res.AlreadyCompleted {
		t.Fatalf("second run = %+v, %v", res, err)
	}
	if n := len(readStream(t, ns, "chat")); n != len(evs) {
		t.Fatalf("a run of a completed task wrote %d events", n-len(evs))
	}
	// Outside a step there is no stream.
	if err := stream.Token(ctx, "x"); !errors.Is(err, stream.ErrNoClaim) {
		t.Fatalf("emit outside a step = %v, want ErrNoClaim", err)
	}
}

func TestRunnerSleepEndsAttempt(t *testing.T) {
	ns := etcdtest.Namespace(t)
	r := newRunner(t, ns, "w1", 5*time.Second, nil)
	steps := []task.Step{
		{Name: "think", Run: func(ctx context.Context, state []byte) ([]byte, error) {
			if err := stream.Token(ctx, "zz"); err != nil {
				return nil, err
			}
			return state, task.Sleep(time.Hour)
		}},
		{Name: "after", Run: func(ctx context.Context, state []byte) ([]byte, error) { return state, nil }},
	}
	res, err := r.Run(context.Background(), "napper", steps)
	if err != nil || res.SleepingUntil.IsZero() {
		t.Fatalf("run = %+v, %v; want a sleep", res, err)
	}
	evs := readStream(t, ns, "napper")
	if got := fmt.Sprint(types(evs)); got != "[attempt_started token attempt_ended]" {
		t.Fatalf("stream = %s", got)
	}
	if !json.Valid(evs[2].Data) || string(evs[2].Data) == "" {
		t.Fatalf("attempt_ended data = %s", evs[2].Data)
	}
	var d struct {
		Outcome string `json:"outcome"`
	}
	_ = json.Unmarshal(evs[2].Data, &d)
	if d.Outcome != "sleeping" {
		t.Fatalf("attempt_ended outcome = %q, want sleeping", d.Outcome)
	}
}

// checkBoundary asserts that evs is one attempt's events, then the
// attempt_lost boundary and the next attempt's, ending with done, and
// returns how many events of the first attempt came after the boundary.
func checkBoundary(t *testing.T, evs []stream.Event) (stale int) {
	t.Helper()
	lost := -1
	for i, ev := range evs {
		if ev.Type == stream.AttemptLost {
			lost = i
			break
		}
	}
	if lost < 2 || evs[0].Type != stream.AttemptStarted || evs[0].Attempt != 1 {
		t.Fatalf("stream = %v: want attempt 1's events, then attempt_lost", types(evs))
	}
	for _, ev := range evs[:lost] {
		if ev.Attempt != 1 {
			t.Fatalf("event %d of attempt %d before the boundary", ev.Seq, ev.Attempt)
		}
	}
	if lost+2 >= len(evs) || evs[lost+1].Type != stream.AttemptStarted || evs[lost+1].Attempt != 2 || evs[len(evs)-1].Type != stream.Done {
		t.Fatalf("after the boundary: %v, want attempt_started of attempt 2, its events, done", types(evs[lost:]))
	}
	for _, ev := range evs[lost+1:] {
		if ev.Attempt != 2 {
			stale++
		}
	}
	return stale
}

// TestRunnerStreamTakeoverAfterKill kills a worker process whose step
// emits tokens, lets another take the task over, and counts, over
// several runs, the events of the killed attempt after the boundary.
func TestRunnerStreamTakeoverAfterKill(t *testing.T) {
	const runs = 3
	const ttl = 2 * time.Second
	stale := 0
	for i := range runs {
		ns := etcdtest.Namespace(t)
		id := fmt.Sprintf("chat-%d", i)
		w := startWorker(t, "run", "H_NS="+ns, "H_TTL="+ttl.String(), "H_STEP=2s", "H_STEPS=3", "H_ID=victim", "H_TASKS="+id, "H_EMIT=1")
		w.await(t, 20*time.Second, "EMITTED victim")
		if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		r := newRunner(t, ns, "rescuer", 5*time.Second, nil)
		var mu sync.Mutex
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), taskIDKey{}, id), 30*time.Second)
		res, err := r.Run(ctx, id, emitting(agentSteps(3, 20*time.Millisecond, "", "rescuer", false), "rescuer", &mu))
		cancel()
		if err != nil || res.ResumedFrom != 1 {
			t.Fatalf("run %d: rescue = %+v, %v", i, res, err)
		}
		stale += checkBoundary(t, readStream(t, ns, id))
	}
	if stale != 0 {
		t.Fatalf("%d events of killed attempts after their boundary in %d runs", stale, runs)
	}
	t.Logf("%d takeovers after SIGKILL: 0 stale events after the boundary", runs)
}

// TestRunnerStreamPausedWriterFenced pauses a worker mid-step while it
// emits, lets another complete the task, then wakes it: its emits are
// refused and nothing of it lands after the boundary.
func TestRunnerStreamPausedWriterFenced(t *testing.T) {
	ns := etcdtest.Namespace(t)
	const ttl = 2 * time.Second
	w := startWorker(t, "run", "H_NS="+ns, "H_TTL="+ttl.String(), "H_STEP=8s", "H_STEPS=2", "H_ID=sleeper", "H_TASKS=chat", "H_EMIT=1")
	// Its step lasts 8 s, well past the pause: woken, it emits again
	// before the step ends.
	w.await(t, 20*time.Second, "EMITTED sleeper")
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r := newRunner(t, ns, "rescuer", 5*time.Second, nil)
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), taskIDKey{}, "chat"), 30*time.Second)
	defer cancel()
	if _, err := r.Run(ctx, "chat", emitting(agentSteps(2, 20*time.Millisecond, "", "rescuer", false), "rescuer", &mu)); err != nil {
		t.Fatal(err)
	}
	before := readStream(t, ns, "chat")
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	w.await(t, 20*time.Second, "FENCED sleeper true")
	w.await(t, 20*time.Second, "RESULT chat fenced=true")
	after := readStream(t, ns, "chat")
	if len(after) != len(before) {
		t.Fatalf("the woken worker wrote %d events after the task was done", len(after)-len(before))
	}
	if n := checkBoundary(t, after); n != 0 {
		t.Fatalf("%d events of the paused attempt after the boundary", n)
	}
}
