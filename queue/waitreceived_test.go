package queue_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An external worker of a plain task (as the HTTP workers are) waits for
// the signal "a", then for "b", then succeeds: each answer gives the
// signal without consuming it, each later outcome names the signals
// received (Outcome.Received), and the success consumes them in its
// fenced transaction. receivedWaits are those waits.
var receivedWaits = []string{"a", "b"}

// runReceived runs the claimed task t under lease l as such a worker,
// logging "worker ANSWER id idem" for each answer, "worker HOLD id n"
// after the hold-th answer (0: never) before it holds until the file
// logPath.go exists (the test kills or pauses it meanwhile), "worker
// LOST id" when an outcome is refused, "worker PARKED id name" and
// "worker DONE id" when it parks or succeeds. A claim that shows a wait
// (after a park) resumes at it.
func runReceived(ctx context.Context, c *queue.Client, l *lease.Lease, t *queue.Task, worker, logPath string, hold int) error {
	logf := func(format string, args ...any) {
		f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintf(f, worker+" "+format+"\n", args...)
			_ = f.Sync()
			f.Close()
		}
	}
	h := queue.Held{Queue: "rsig", ID: t.ID, Token: t.Token, Lease: l.ID()}
	var received []queue.SignalRef
	start, until := 0, time.Time{}
	if wf := t.WaitingFor; wf != nil && len(wf.Signals) == 1 {
		start, until = slices.Index(receivedWaits, wf.Signals[0]), wf.Until
	}
	for i := start; i < len(receivedWaits); i++ {
		rep, err := c.Report(ctx, []queue.Outcome{{Held: h, Wait: &task.Wait{Signals: []string{receivedWaits[i]}, Until: until}, Received: received}})
		until = time.Time{}
		switch {
		case err != nil:
			return err
		case rep[0].Err != nil:
			logf("LOST %s", t.ID)
			return nil
		case rep[0].Signal == nil:
			logf("PARKED %s %s", t.ID, receivedWaits[i])
			return nil
		}
		sg := rep[0].Signal
		logf("ANSWER %s %s", t.ID, sg.IdempotencyKey)
		received = append(received, queue.SignalRef{Name: sg.Name, IdempotencyKey: sg.IdempotencyKey})
		if len(received) == hold {
			logf("HOLD %s %d", t.ID, hold)
			for try := 0; try < 6000; try++ { // at most 10 minutes
				if _, err := os.Stat(logPath + ".go"); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	rep, err := c.Report(ctx, []queue.Outcome{{Held: h, Result: []byte(`"done"`), Received: received}})
	if err != nil {
		return err
	}
	if rep[0].Err != nil {
		logf("LOST %s", t.ID)
		return nil
	}
	logf("DONE %s", t.ID)
	return nil
}

// runReceivedHelper is the worker process of these tests: it claims the
// tasks of queue "rsig" one at a time under a lease of H_TTL and runs
// each (runReceived), holding after answer H_HOLD, until killed.
func runReceivedHelper() int {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: strings.Split(os.Getenv("H_ENDPOINTS"), ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	c, err := queue.NewClient(cli, os.Getenv("H_NS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	l, err := lease.Grant(ctx, cli, 2*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	hold := 0
	_, _ = fmt.Sscan(os.Getenv("H_HOLD"), &hold)
	for range 100000 {
		ts, err := c.Claim(ctx, "rsig", queue.ClaimRequest{Lease: l, Worker: "victim", Max: 1, Wait: time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for _, t := range ts {
			if err := runReceived(ctx, c, l, t, "victim", os.Getenv("H_LOG"), hold); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
	return 0
}

// startReceivedVictim starts the worker process, holding after answer
// hold.
func startReceivedVictim(t *testing.T, ns, logPath string, hold int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=received", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","), "H_NS="+ns,
		"H_LOG="+logPath, fmt.Sprintf("H_HOLD=%d", hold))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGCONT); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// rescue claims and runs task id in this process as "rescuer" until it
// succeeds (each claim waits for the victim's lease to end).
func rescue(t *testing.T, c *queue.Client, cli *clientv3.Client, id, logPath string) {
	t.Helper()
	ctx := context.Background()
	l := grantLease(t, cli, 10*time.Second)
	waitUntil(t, id+" to be rescued", func() bool {
		ts, err := c.Claim(ctx, "rsig", queue.ClaimRequest{Lease: l, Worker: "rescuer", Max: 1, Wait: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range ts {
			if err := runReceived(ctx, c, l, tk, "rescuer", logPath, 0); err != nil {
				t.Fatal(err)
			}
		}
		return logCount(logPath, "rescuer", "DONE", id) > 0
	})
}

// checkConsumedOnce asserts that task id SUCCEEDED, and that each of its
// signals was consumed once: a tombstone each, nothing left in the inbox.
func checkConsumedOnce(t *testing.T, c *queue.Client, cli *clientv3.Client, ns, id string, signals int) {
	t.Helper()
	ctx := context.Background()
	if got, err := c.Get(ctx, id); err != nil || got.CurrentStatus != queue.Succeeded {
		t.Fatalf("%s: %+v, %v: want SUCCEEDED", id, got, err)
	}
	keys := keyspace.MustNew(ns)
	in, _ := cli.Get(ctx, keys.TaskSignals(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
	seen, _ := cli.Get(ctx, keys.TaskSignalsSeen(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if in.Count != 0 || seen.Count != int64(signals) {
		t.Fatalf("%s: %d signals left in the inbox, %d consumed: want 0 and %d", id, in.Count, seen.Count, signals)
	}
}

// signalBoth sends task id its signals a and b, keyed "a-{id}" and
// "b-{id}".
func signalBoth(t *testing.T, c *queue.Client, id string) {
	t.Helper()
	for _, n := range receivedWaits {
		if _, err := c.Signal(context.Background(), id, n, nil, n+"-"+id); err != nil {
			t.Fatal(err)
		}
	}
}

// An answer lost on its way (the worker never reads it) consumes nothing:
// the same wait reported again is answered the same signal, and a wait
// for the same name that names it received skips it.
func TestReceivedSignalAnswerLost(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitN(t, c, "rsig", 1, nil)
	id := "rsig-0"
	signalBoth(t, c, id)
	if _, err := c.Signal(ctx, id, "a", nil, "a2-"+id); err != nil {
		t.Fatal(err)
	}
	l := grantLease(t, cli, 30*time.Second)
	ts, err := c.Claim(ctx, "rsig", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
	if err != nil || len(ts) != 1 {
		t.Fatal(len(ts), err)
	}
	h := held("rsig", ts[0], l)
	wait := func(received ...queue.SignalRef) string {
		t.Helper()
		rep, err := c.Report(ctx, []queue.Outcome{{Held: h, Wait: &task.Wait{Signals: []string{"a"}}, Received: received}})
		if err != nil || rep[0].Err != nil || rep[0].Signal == nil {
			t.Fatalf("the wait: %+v, %v; want answered at once", rep, err)
		}
		return rep[0].Signal.IdempotencyKey
	}
	if k1, k2 := wait(), wait(); k1 != "a-"+id || k2 != k1 {
		t.Fatalf("the wait answered %q, then again %q: want a-%s twice", k1, k2, id)
	}
	if k := wait(queue.SignalRef{Name: "a", IdempotencyKey: "a-" + id}); k != "a2-"+id {
		t.Fatalf("the wait that names a-%s received answered %q: want the next, a2-%s", id, k, id)
	}
	sigs, _ := c.Signals(ctx, id)
	for _, s := range sigs {
		if s.Consumed {
			t.Fatalf("answers consumed %s", s.IdempotencyKey)
		}
	}
	// The success consumes what it names, and only that.
	rep, err := c.Report(ctx, []queue.Outcome{{Held: h, Received: []queue.SignalRef{{Name: "a", IdempotencyKey: "a-" + id}, {Name: "a", IdempotencyKey: "a-" + id}}}})
	if err != nil || rep[0].Err != nil {
		t.Fatal(rep, err)
	}
	sigs, _ = c.Signals(ctx, id)
	consumed := 0
	for _, s := range sigs {
		if s.Consumed {
			consumed++
			if s.IdempotencyKey != "a-"+id || s.SentAt.IsZero() {
				t.Fatalf("consumed %+v; want a-%s with when it was sent", s, id)
			}
		}
	}
	if consumed != 1 || len(sigs) != 3 {
		t.Fatalf("%d signals, %d consumed: want 3, 1", len(sigs), consumed)
	}
}

// A worker process SIGKILLed after an answer (the first, or the second,
// whose wait named the first received) consumed nothing: the next claim
// is answered the same signals, and its success consumes each once.
func TestReceivedSignalWorkerKilledAfterAnswer(t *testing.T) {
	for _, hold := range []int{1, 2} {
		t.Run(fmt.Sprintf("after-answer-%d", hold), func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			c, cli := newClient(t, ns)
			logPath := filepath.Join(t.TempDir(), "log")
			submitN(t, c, "rsig", 1, nil)
			id := "rsig-0"
			signalBoth(t, c, id)
			victim := startReceivedVictim(t, ns, logPath, hold)
			waitUntil(t, "the victim to hold", func() bool { return logCount(logPath, "victim", "HOLD", id) == 1 })
			_ = victim.Process.Signal(syscall.SIGKILL)
			_ = victim.Wait()
			rescue(t, c, cli, id, logPath)
			if n := logCount(logPath, "rescuer", "ANSWER", id); n != 2 {
				t.Fatalf("the rescuer was answered %d signals, want both", n)
			}
			checkConsumedOnce(t, c, cli, ns, id, 2)
		})
	}
}

// A worker process SIGSTOPped after its second answer, past its lease:
// another claim is answered the same signals and its success consumes
// them; the paused worker, continued, sends its success naming them and
// finds it refused: each signal consumed once, one success.
func TestReceivedSignalWorkerPausedAfterAnswer(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	logPath := filepath.Join(t.TempDir(), "log")
	submitN(t, c, "rsig", 1, nil)
	id := "rsig-0"
	signalBoth(t, c, id)
	victim := startReceivedVictim(t, ns, logPath, 2)
	waitUntil(t, "the victim to hold", func() bool { return logCount(logPath, "victim", "HOLD", id) == 1 })
	_ = victim.Process.Signal(syscall.SIGSTOP)
	rescue(t, c, cli, id, logPath)
	checkConsumedOnce(t, c, cli, ns, id, 2)
	if err := os.WriteFile(logPath+".go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_ = victim.Process.Signal(syscall.SIGCONT)
	waitUntil(t, "the victim's success to be refused", func() bool { return logCount(logPath, "victim", "LOST", id) == 1 })
	if n := logCount(logPath, "", "DONE", id); n != 1 {
		t.Fatalf("%d successes, want the rescuer's alone", n)
	}
	checkConsumedOnce(t, c, cli, ns, id, 2)
}

// A wait that parks consumes the signals its claim received, in the
// park's transaction: the task WAITING, its first signal consumed, the
// second to come; once sent, the task is claimed again at that wait,
// answered it, and its success consumes it.
func TestReceivedSignalConsumedByPark(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	logPath := filepath.Join(t.TempDir(), "log")
	submitN(t, c, "rsig", 1, nil)
	id := "rsig-0"
	ctx := context.Background()
	if _, err := c.Signal(ctx, id, "a", nil, "a-"+id); err != nil {
		t.Fatal(err)
	}
	startReceivedVictim(t, ns, logPath, 0)
	waitUntil(t, "the task to park", func() bool { return logCount(logPath, "victim", "PARKED", id, "b") == 1 })
	if got, err := c.Get(ctx, id); err != nil || got.CurrentStatus != queue.Waiting {
		t.Fatalf("%s: %+v, %v: want WAITING", id, got, err)
	}
	keys := keyspace.MustNew(ns)
	seen, _ := cli.Get(ctx, keys.TaskSignalSeen(id, "a", "a-"+id), clientv3.WithCountOnly())
	if seen.Count != 1 {
		t.Fatal("the park did not consume the signal its claim received")
	}
	if r, err := c.Signal(ctx, id, "b", nil, "b-"+id); err != nil || !r.Woke {
		t.Fatalf("signal b: %+v, %v: want it to wake the task", r, err)
	}
	waitUntil(t, "the task to succeed", func() bool { return logCount(logPath, "victim", "DONE", id) == 1 })
	if n := logCount(logPath, "victim", "ANSWER", id); n != 2 {
		t.Fatalf("%d answers, want 2 (a, then b after the park)", n)
	}
	checkConsumedOnce(t, c, cli, ns, id, 2)
}

// A failure to be retried and a sleep run the handler over: the signals
// they name received stay in the inbox, to be answered again.
func TestReceivedSignalLeftByRetryAndSleep(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitN(t, c, "rsig", 2, nil)
	l := grantLease(t, cli, 30*time.Second)
	ts, err := c.Claim(ctx, "rsig", queue.ClaimRequest{Lease: l, Worker: "w", Max: 2})
	if err != nil || len(ts) != 2 {
		t.Fatal(len(ts), err)
	}
	for i, tk := range ts {
		if _, err := c.Signal(ctx, tk.ID, "a", nil, "a-"+tk.ID); err != nil {
			t.Fatal(err)
		}
		o := queue.Outcome{Held: held("rsig", tk, l), Received: []queue.SignalRef{{Name: "a", IdempotencyKey: "a-" + tk.ID}}}
		if i == 0 {
			o.Failed, o.Error = true, "transient"
		} else {
			o.SleepUntil = time.Now().Add(time.Hour)
		}
		rep, err := c.Report(ctx, []queue.Outcome{o})
		if err != nil || rep[0].Err != nil {
			t.Fatal(rep, err)
		}
		sigs, _ := c.Signals(ctx, tk.ID)
		if len(sigs) != 1 || sigs[0].Consumed {
			t.Fatalf("%s after its %s: signals %+v; want a, not consumed", tk.ID, rep[0].Task.CurrentStatus, sigs)
		}
	}
}

// A wait that names a signal received, whose park finds a signal it
// waits for come since the inbox was read, hands the task back to
// pending and consumes nothing: the next claim runs the handler over, is
// answered both signals again, and its success consumes each once.
func TestReceivedSignalParkHandedBack(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	logPath := filepath.Join(t.TempDir(), "log")
	submitN(t, c, "rsig", 1, nil)
	id := "rsig-0"
	if _, err := c.Signal(ctx, id, "a", nil, "a-"+id); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	queue.SetBeforeParkHook(func() {
		once.Do(func() {
			if _, err := c.Signal(ctx, id, "b", nil, "b-"+id); err != nil {
				t.Error(err)
			}
		})
	})
	defer queue.SetBeforeParkHook(nil)
	l := grantLease(t, cli, 30*time.Second)
	ts, err := c.Claim(ctx, "rsig", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
	if err != nil || len(ts) != 1 {
		t.Fatal(len(ts), err)
	}
	if err := runReceived(ctx, c, l, ts[0], "first", logPath, 0); err != nil {
		t.Fatal(err)
	}
	queue.SetBeforeParkHook(nil)
	if got, err := c.Get(ctx, id); err != nil || got.CurrentStatus != queue.Pending || got.WaitingFor != nil {
		t.Fatalf("%s after the park met a signal: %+v, %v: want PENDING, waiting for nothing", id, got, err)
	}
	sigs, _ := c.Signals(ctx, id)
	if len(sigs) != 2 || sigs[0].Consumed || sigs[1].Consumed {
		t.Fatalf("signals after the hand back: %+v; want a and b, neither consumed", sigs)
	}
	ts, err = c.Claim(ctx, "rsig", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1, Wait: 5 * time.Second})
	if err != nil || len(ts) != 1 {
		t.Fatal(len(ts), err)
	}
	if err := runReceived(ctx, c, l, ts[0], "second", logPath, 0); err != nil {
		t.Fatal(err)
	}
	if logCount(logPath, "second", "DONE", id) != 1 || logCount(logPath, "second", "ANSWER", id) != 2 {
		t.Fatalf("the second claim did not run over with both signals: %d answers", logCount(logPath, "second", "ANSWER", id))
	}
	checkConsumedOnce(t, c, cli, ns, id, 2)
}
