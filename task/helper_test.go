package task_test

// Worker processes for the tests: the test binary re-executes itself with
// helperEnv set and runs a task runner, so tests can SIGKILL and SIGSTOP real
// workers.

import (
	"github.com/droverhq/drover/lock/paxoslock"
	"github.com/droverhq/drover/lock/redislock"

	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/task"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const helperEnv = "DROVER_TASK_TEST_HELPER"

// agentSteps returns n fake agent steps named s1..sn. Each logs its start to
// logPath ("task step worker" lines), works for d without heeding ctx (as a
// blocking LLM call would), appends its name to the state, and, when report
// is set, prints whether ctx had been cancelled by the time it finished.
func agentSteps(n int, d time.Duration, logPath, worker string, report bool) []task.Step {
	steps := make([]task.Step, n)
	for i := range steps {
		name := fmt.Sprintf("s%d", i+1)
		steps[i] = task.Step{Name: name, Run: func(ctx context.Context, state []byte) ([]byte, error) {
			if logPath != "" {
				if err := appendLine(logPath, fmt.Sprintf("%s %s %s", taskIDFrom(ctx), name, worker)); err != nil {
					return nil, err
				}
			}
			time.Sleep(d)
			if report {
				// A worker paused past its TTL wakes with its sleep over and
				// its loss not yet noticed: both timers fire at once. Give the
				// loss a bounded moment to cancel ctx before reporting.
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Second):
				}
				fmt.Printf("STEPCTX %s cancelled=%t\n", name, ctx.Err() != nil)
			}
			return append(append([]byte{}, state...), "|"+name...), nil
		}}
	}
	return steps
}

type taskIDKey struct{}

func taskIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(taskIDKey{}).(string)
	return id
}

var appendMu sync.Mutex

// appendLine appends one line with O_APPEND: lines from several processes
// never interleave.
func appendLine(path, line string) error {
	appendMu.Lock()
	defer appendMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func runHelper(mode string) int {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: strings.Split(os.Getenv("H_ENDPOINTS"), ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	ttl, _ := time.ParseDuration(os.Getenv("H_TTL"))
	stepDur, _ := time.ParseDuration(os.Getenv("H_STEP"))
	nsteps, _ := strconv.Atoi(os.Getenv("H_STEPS"))
	worker := os.Getenv("H_ID")
	var outMu sync.Mutex
	cfg := task.RunnerConfig{
		Namespace: os.Getenv("H_NS"), WorkerID: worker, TTL: ttl,
		OnEvent: func(ev task.Event) {
			b, _ := json.Marshal(ev)
			outMu.Lock()
			fmt.Printf("EVENT %s\n", b)
			outMu.Unlock()
		},
	}
	if url := os.Getenv("H_LOCKER"); url != "" {
		locker, done, err := lockerFor(url, cfg.Namespace, ttl, worker)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer done()
		cfg.Locker, cfg.TTL = locker, 0
	}
	r, err := task.NewRunner(ctx, cli, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer r.Close(ctx)
	steps := agentSteps(nsteps, stepDur, os.Getenv("H_LOG"), worker, mode == "report")
	if os.Getenv("H_EMIT") != "" {
		steps = emitting(steps, worker, &outMu)
	}
	for _, id := range strings.Split(os.Getenv("H_TASKS"), ",") {
		_, err := r.Run(context.WithValue(ctx, taskIDKey{}, id), id, steps)
		if err != nil {
			fmt.Printf("RESULT %s fenced=%t err=%q\n", id, errors.Is(err, lock.ErrFenced), err.Error())
			return 1
		}
		fmt.Printf("RESULT %s ok\n", id)
	}
	return 0
}

// lockerFor opens the locker at url, redis://HOST:PORT or
// paxos://HOST:PORT,..., with namespace ns, TTL ttl and holder id; done
// closes it.
func lockerFor(url, ns string, ttl time.Duration, id string) (locker lock.Locker, done func(), err error) {
	switch {
	case strings.HasPrefix(url, "redis://"):
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, err
		}
		rdb := redis.NewClient(opt)
		l, err := redislock.New(rdb, redislock.Config{Namespace: ns, TTL: ttl, HolderID: id})
		if err != nil {
			_ = rdb.Close()
			return nil, nil, err
		}
		return l, func() { _ = rdb.Close() }, nil
	case strings.HasPrefix(url, "paxos://"):
		l, err := paxoslock.New(paxoslock.Config{Endpoints: strings.Split(strings.TrimPrefix(url, "paxos://"), ","), Namespace: ns, TTL: ttl, HolderID: id})
		if err != nil {
			return nil, nil, err
		}
		return l, func() { _ = l.Close(context.Background()) }, nil
	}
	return nil, nil, fmt.Errorf("no locker for %q", url)
}

// worker is a running worker process.
type worker struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []string
	update chan struct{}
	done   chan struct{}
}

func startWorker(t testing.TB, mode string, env ...string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode, "H_ENDPOINTS=" + strings.Join(srv.Endpoints(), ",")}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: cmd, update: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.mu.Unlock()
			select {
			case w.update <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		<-w.done
	})
	return w
}

// await returns the first output line that contains all of parts, waiting up
// to d for it.
func (w *worker) await(t testing.TB, d time.Duration, parts ...string) string {
	t.Helper()
	deadline := time.After(d)
	for {
		w.mu.Lock()
		for _, l := range w.lines {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(l, p)
			}
			if ok {
				w.mu.Unlock()
				return l
			}
		}
		w.mu.Unlock()
		select {
		case <-w.update:
		case <-w.done:
			// Output ended: one last look, then give up.
			select {
			case <-deadline:
			default:
			}
			w.mu.Lock()
			all := strings.Join(w.lines, "\n")
			w.mu.Unlock()
			for _, l := range strings.Split(all, "\n") {
				ok := true
				for _, p := range parts {
					ok = ok && strings.Contains(l, p)
				}
				if ok {
					return l
				}
			}
			t.Fatalf("worker ended without printing %q; output:\n%s", parts, all)
		case <-deadline:
			t.Fatalf("worker printed no %q within %s", parts, d)
		}
	}
}

// newExampleClient connects to the package's test server, for examples.
func newExampleClient() (*clientv3.Client, error) {
	return cluster.Connect(context.Background(), cluster.ClientConfig{Endpoints: srv.Endpoints()})
}
