package queue_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// chaosWorker is a worker process of the chaos run and what its output
// told: the attempts it started and has not ended.
type chaosWorker struct {
	cmd     *exec.Cmd
	read    chan struct{} // closed when all of its output was read
	mu      sync.Mutex
	running map[string]int // task id → attempt
}

// restart is a task of a killed worker and when it started again.
type restart struct {
	id      string
	attempt int
	at      time.Time
}

// TestChaosRerunDelay is the long chaos run behind DROVER_CHAOS=1: 10,000
// tasks of 50 ms, three worker processes of concurrency 8 with a 3 s TTL, one
// killed with SIGKILL every 2 s and replaced. For every task a killed worker
// was running, it measures the delay from the kill to the task's next
// start. The short version that CI runs is TestDeadWorkerTasksRunAgainWithinTTL.
//
//	DROVER_CHAOS=1 go test ./queue -run TestChaosRerunDelay -v -timeout 20m
func TestChaosRerunDelay(t *testing.T) {
	if os.Getenv("DROVER_CHAOS") == "" {
		t.Skip("the long chaos run: set DROVER_CHAOS=1")
	}
	const n, ttl = 10000, 3 * time.Second
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	if res, err := c.Submit(context.Background(), "jobs", tasks(n, "work"), nil); err != nil || res.Submitted != n {
		t.Fatalf("submit: %+v, %v", res, err)
	}
	restarts := make(chan restart, 100000)
	spawn := func() *chaosWorker {
		cw := &chaosWorker{running: map[string]int{}, read: make(chan struct{})}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=slow", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","), "H_NS="+ns,
			"H_CONCURRENCY=8", "H_TTL="+ttl.String())
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cw.cmd = cmd
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		go func() {
			defer close(cw.read)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) < 3 {
					continue
				}
				a, _ := strconv.Atoi(f[2])
				cw.mu.Lock()
				switch f[0] {
				case "START":
					cw.running[f[1]] = a
					if ns, err := strconv.ParseInt(f[3], 10, 64); err == nil && a > 1 {
						restarts <- restart{f[1], a, time.Unix(0, ns)}
					}
				case "END":
					delete(cw.running, f[1])
				}
				cw.mu.Unlock()
			}
		}()
		return cw
	}
	workers := []*chaosWorker{spawn(), spawn(), spawn()}
	type victim struct {
		killed time.Time
		tasks  map[string]int
	}
	var victims []victim
	for i := 0; ; i++ {
		time.Sleep(2 * time.Second)
		st, err := c.Stats(context.Background(), "jobs")
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending < 1000 || i > 60 {
			break // keep a backlog while killing
		}
		k := i % len(workers)
		cw := workers[k]
		_ = cw.cmd.Process.Signal(syscall.SIGKILL)
		killed := time.Now()
		<-cw.read
		_ = cw.cmd.Wait()
		cw.mu.Lock()
		victims = append(victims, victim{killed, maps(cw.running)})
		cw.mu.Unlock()
		workers[k] = spawn()
	}
	// Wait for the next start of every task a victim was running: the
	// first start of a later attempt.
	type key struct {
		id      string
		attempt int
	}
	pending := map[key]time.Time{} // a victim's task → when its worker was killed
	for _, v := range victims {
		for id, a := range v.tasks {
			pending[key{id, a}] = v.killed
		}
	}
	want := len(pending)
	var all []time.Duration
	firsts := map[time.Time]time.Duration{} // per kill, its first task's delay
	deadline := time.After(2 * time.Minute)
collect:
	for len(pending) > 0 {
		select {
		case r := <-restarts:
			for k, killed := range pending {
				if k.id == r.id && r.attempt > k.attempt {
					d := r.at.Sub(killed)
					all = append(all, d)
					if f, ok := firsts[killed]; !ok || d < f {
						firsts[killed] = d
					}
					delete(pending, k)
				}
			}
		case <-deadline:
			break collect
		}
	}
	for k := range pending {
		if got, err := c.Get(context.Background(), k.id); err == nil {
			t.Logf("%s (attempt %d at the kill) not seen again: %s, transitions %+v", k.id, k.attempt, got.CurrentStatus, got.Transitions)
		}
	}
	missing := len(pending)
	var firstDelays []time.Duration
	for _, d := range firsts {
		firstDelays = append(firstDelays, d)
	}
	slices.Sort(all)
	slices.Sort(firstDelays)
	q := func(d []time.Duration, p int) time.Duration {
		return d[min(len(d)-1, len(d)*p/100)].Round(10 * time.Millisecond)
	}
	if len(all) == 0 {
		t.Fatal("no task of a killed worker ran again")
	}
	t.Logf("%d kills, %d tasks in flight at the kills, %d not seen again within 2 min", len(victims), want, missing)
	t.Logf("first task of each killed worker: median %s, max %s", q(firstDelays, 50), firstDelays[len(firstDelays)-1].Round(10*time.Millisecond))
	t.Logf("every task in flight: median %s, p90 %s, p99 %s, max %s (TTL %s)", q(all, 50), q(all, 90), q(all, 99), all[len(all)-1].Round(10*time.Millisecond), ttl)
	if missing > 0 || q(all, 99) > ttl+time.Second {
		t.Fatalf("p99 %s, %d missing: want every task again within TTL + 1 s at p99", q(all, 99), missing)
	}
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
