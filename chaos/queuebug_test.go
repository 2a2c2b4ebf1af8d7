package chaos

import (
	"syscall"
	"testing"
	"time"
)

// TestQueuePausedWorkerStartsNoTask: a worker woken from a pause longer
// than its TTL starts none of the tasks it claimed before the pause. Its
// lease, and with it every claim, is gone, and other workers have run those
// tasks since.
//
// TestQueueChaos found it broken: the worker checked its lease's context
// before starting a task (queue/run.go, startWhenFree), which the lease's
// renewal goroutine cancels, and after a SIGCONT the goroutines waiting for
// a running slot could run first; the handler got a live context and the
// work ran again after the task's next attempt (its outcome was refused).
// A task now starts only while the lease holds by its own deadline
// (lease.Lease.Err): 1 stale start in 5 pauses before, none after.
//
// Tasks of 1 ms, a worker of concurrency 1 that claims 16 ahead (they wait
// for its running slot), SIGSTOPped for TTL + 1 s and continued, five
// times; any attempt the woken worker starts fails the test.
//
//	DROVER_CHAOS=long go test -run TestQueuePausedWorkerStartsNoTask -v ./chaos/
func TestQueuePausedWorkerStartsNoTask(t *testing.T) {
	if !long() {
		t.Skip("five pauses past the TTL, about a minute: DROVER_CHAOS=long runs it")
	}
	set := startEtcdSet(t, droverBin(t), 1)
	cfg := queueConfig{tasks: 20000, workers: 2, concurrency: 1, prefetch: 16, ttl: 2 * time.Second, taskTime: time.Millisecond}
	r := newQueueRun(t, set, cfg)
	r.submit()
	r.workers = []*workerProc{r.startWorker(0)}
	for try := range 5 {
		victim := r.startWorker(1)
		time.Sleep(time.Second)
		if err := victim.signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		paused := time.Now()
		time.Sleep(cfg.ttl + time.Second)
		_ = victim.signal(syscall.SIGCONT)
		p := fault{kind: faultWorkerPause, at: paused, until: time.Now(), pids: []int{victim.pid}}
		if !victim.wait(10 * time.Second) {
			t.Fatalf("the woken worker did not exit within 10 s (its lease is lost)")
		}
		attempts, _, err := readAttempts(r.log)
		if err != nil {
			t.Fatal(err)
		}
		var stale []string
		for _, as := range attempts {
			for _, a := range as {
				if a.pid == victim.pid && a.start > paused.Add(500*time.Millisecond).UnixNano() {
					stale = append(stale, staleStart(a, as, p))
				}
			}
		}
		if len(stale) > 0 {
			t.Fatalf("pause %d: the woken worker started %d attempts after its lease was gone, e.g.: %v", try+1, len(stale), first(stale))
		}
	}
	t.Logf("five pauses past the TTL, no attempt started by a woken worker")
}
