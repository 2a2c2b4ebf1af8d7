package httpapi_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
)

// BenchmarkQueueExternalDirect drains benchTasks tasks through the
// external-worker API called in process by 64 goroutines, each under its
// own lease (claim up to 8, one Report): what the HTTP workers do, without
// HTTP. It tells how much of the HTTP workers' gap to the Go worker is
// HTTP's and how much the claim model's (64 independent claimers).
func BenchmarkQueueExternalDirect(b *testing.B) {
	s := fsyncServer(b)
	_, cli := benchClients(b, s) // the HTTP API's side, without HTTP
	for i := 0; i < b.N; i++ {
		ns := fmt.Sprintf("bench-qdirect-%d-%d", time.Now().UnixNano(), i)
		fill(b, cli, ns)
		c, err := queue.NewClient(cli, ns)
		if err != nil {
			b.Fatal(err)
		}
		var left atomic.Int64
		left.Store(benchTasks)
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		b.StartTimer()
		for w := 0; w < 64; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := lease.Grant(context.Background(), cli, 30*time.Second)
				if err != nil {
					errs <- err
					return
				}
				defer l.Close(context.Background())
				for left.Load() > 0 {
					tasks, err := c.Claim(context.Background(), "q", queue.ClaimRequest{Lease: l, Worker: "direct", Max: 8, Wait: 200 * time.Millisecond})
					if err != nil {
						errs <- err
						return
					}
					if len(tasks) == 0 {
						continue
					}
					os := make([]queue.Outcome, len(tasks))
					for k, t := range tasks {
						os[k] = queue.Outcome{Held: queue.Held{Queue: "q", ID: t.ID, Token: t.Token, Lease: l.ID()}}
					}
					if _, err := c.Report(context.Background(), os); err != nil {
						errs <- err
						return
					}
					left.Add(-int64(len(tasks)))
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*benchTasks)/b.Elapsed().Seconds(), "tasks/s")
}

// BenchmarkQueueExternalCombined is the experiment behind the next design
// of HTTP claims: the same 64 consumers, but their claims combined into one
// claimer (up to 64 tasks per claim transaction, one lease) and their
// outcomes into one reporter (gathered for up to 2 ms, up to 256 per
// Report), as a server could combine its concurrent requests.
func BenchmarkQueueExternalCombined(b *testing.B) {
	s := fsyncServer(b)
	_, cli := benchClients(b, s) // the HTTP API's side, without HTTP
	for i := 0; i < b.N; i++ {
		ns := fmt.Sprintf("bench-qcomb-%d-%d", time.Now().UnixNano(), i)
		fill(b, cli, ns)
		c, err := queue.NewClient(cli, ns)
		if err != nil {
			b.Fatal(err)
		}
		l, err := lease.Grant(context.Background(), cli, 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		work := make(chan *queue.Task, 128)
		done := make(chan queue.Outcome, 256)
		var left atomic.Int64
		left.Store(benchTasks)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		b.StartTimer()
		wg.Add(2)
		go func() { // the claimer
			defer wg.Done()
			defer close(work)
			for ctx.Err() == nil {
				tasks, err := c.Claim(ctx, "q", queue.ClaimRequest{Lease: l, Worker: "comb", Max: 64, Wait: 200 * time.Millisecond})
				if err != nil {
					return
				}
				for _, t := range tasks {
					work <- t
				}
			}
		}()
		go func() { // the reporter
			defer wg.Done()
			for {
				var batch []queue.Outcome
				select {
				case o := <-done:
					batch = append(batch, o)
				case <-ctx.Done():
					return
				}
				timer := time.After(2 * time.Millisecond)
			gather:
				for len(batch) < 256 {
					select {
					case o := <-done:
						batch = append(batch, o)
					case <-timer:
						break gather
					}
				}
				if _, err := c.Report(context.Background(), batch); err != nil {
					b.Error(err)
				}
				if left.Add(-int64(len(batch))) <= 0 {
					cancel()
				}
			}
		}()
		var consumers sync.WaitGroup
		for w := 0; w < 64; w++ {
			consumers.Add(1)
			go func() {
				defer consumers.Done()
				for t := range work {
					done <- queue.Outcome{Held: queue.Held{Queue: "q", ID: t.ID, Token: t.Token, Lease: l.ID()}}
				}
			}()
		}
		wg.Wait()
		consumers.Wait()
		b.StopTimer()
		_ = l.Close(context.Background())
	}
	b.ReportMetric(float64(b.N*benchTasks)/b.Elapsed().Seconds(), "tasks/s")
}
