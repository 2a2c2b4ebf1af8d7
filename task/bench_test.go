package task_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/task"
)

// BenchmarkTakeover measures how long a task stays unattended after its
// worker dies: from SIGKILL of the worker process mid-step to the first step
// start of the worker that takes over (already waiting, on a watch). The
// kill lands at a random point of the lease's renewal cycle. Run it with
// -benchtime 20x; it reports the median and the maximum, and the median's
// distance past the TTL.
func BenchmarkTakeover(b *testing.B) {
	for _, ttl := range []time.Duration{2 * time.Second, 5 * time.Second, 10 * time.Second} {
		b.Run(fmt.Sprintf("ttl=%s", ttl), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, uint64(ttl)))
			ns := etcdtest.Namespace(b)
			var samples []time.Duration
			for i := 0; i < b.N; i++ {
				id := fmt.Sprintf("takeover-%d", i)
				w := startWorker(b, "run", "H_NS="+ns, "H_TTL="+ttl.String(), "H_STEP=10m", "H_STEPS=2", "H_ID=victim", "H_TASKS="+id)
				w.await(b, 30*time.Second, `"type":"step_started"`)
				cli := srv.Client(b)
				started := make(chan time.Time, 1)
				waiting := make(chan struct{})
				r, err := task.NewRunner(context.Background(), cli, task.RunnerConfig{Namespace: ns, WorkerID: "rescuer", TTL: ttl,
					OnEvent: func(ev task.Event) {
						if ev.Type == task.EventWaiting {
							close(waiting)
						}
						if ev.Type == task.EventStepStarted {
							select {
							case started <- time.Now():
							default:
							}
						}
					}})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() {
					_, err := r.Run(ctx, id, agentSteps(2, 0, "", "rescuer", false))
					done <- err
				}()
				<-waiting // the rescuer is queued before the kill
				time.Sleep(time.Duration(rng.Int64N(int64(ttl / 3))))
				killed := time.Now()
				if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					b.Fatal(err)
				}
				select {
				case at := <-started:
					samples = append(samples, at.Sub(killed))
				case <-time.After(ttl + 10*time.Second):
					b.Fatalf("no takeover within TTL + 10s")
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				cancel()
				_ = r.Close(context.Background())
			}
			slices.Sort(samples)
			median := samples[len(samples)/2]
			if len(samples)%2 == 0 {
				median = (samples[len(samples)/2-1] + samples[len(samples)/2]) / 2
			}
			maxd := samples[len(samples)-1]
			b.ReportMetric(float64(median.Milliseconds()), "median-ms")
			b.ReportMetric(float64(maxd.Milliseconds()), "max-ms")
			b.ReportMetric(float64((median - ttl).Milliseconds()), "median-past-ttl-ms")
			b.ReportMetric(median.Seconds()/ttl.Seconds(), "median/ttl")
			b.ReportMetric(maxd.Seconds()/ttl.Seconds(), "max/ttl")
		})
	}
}
