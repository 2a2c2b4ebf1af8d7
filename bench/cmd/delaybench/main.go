// Command delaybench measures delayed tasks at scale on the task queues
// users would pick instead of drover's, in the shape of drover's
// TestDelayedAtScale (queue/delay_scale_test.go): N tasks due at random
// times uniformly over a window that opens once all are submitted, two
// workers of concurrency 64 idle and ready before it opens; each task
// records when its handler started against its due time. It prints one
// JSON line: lateness p50, p99 and max (negative: early), the tasks
// claimed early, and the tasks claimed by the deadline (the window's end
// plus -tail).
//
// Systems:
//
//	asynq        hibiken/asynq, Client.Enqueue with ProcessAt from 64
//	             goroutines, two Servers of Concurrency 64 with the default
//	             DelayedTaskCheckInterval (5 s)
//	asynq-100ms  the same with DelayedTaskCheckInterval 100 ms
//	river        riverqueue/river, InsertMany of 1,000 with
//	             InsertOpts.ScheduledAt, two Clients of MaxWorkers 64 with
//	             the defaults (FetchPollInterval 1 s, FetchCooldown 100 ms;
//	             the scheduler's 5 s interval is not a setting)
//	river-tuned  the same with FetchPollInterval 100 ms, FetchCooldown 1 ms
//
// asynq runs on the Redis at -redis (db 9, flushed before and after),
// River on the PostgreSQL at -postgres in schema -schema (dropped and
// migrated anew, dropped after). Loopback only.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync/atomic"
	"time"
)

// result is one system's JSON line; its shape is the one bench/run-delayed.sh
// gives drover's figures too.
type result struct {
	System     string         `json:"system"`
	Tasks      int            `json:"tasks"`
	WindowS    float64        `json:"window_s"`
	TailS      float64        `json:"tail_s"`
	LeadS      float64        `json:"lead_s"`
	SubmittedS float64        `json:"submitted_s"`
	Claimed    int            `json:"claimed_by_deadline"`
	P50Ms      float64        `json:"lateness_p50_ms"`
	P99Ms      float64        `json:"lateness_p99_ms"`
	MaxMs      float64        `json:"lateness_max_ms"`
	Early      int            `json:"early"`
	EarlyMaxMs float64        `json:"early_max_ms"`
	Duplicates int64          `json:"duplicates"`
	Config     string         `json:"config"`
	Notes      map[string]any `json:"notes,omitempty"`
}

// plan is the run every system follows: the due times, the window's
// start and the deadline past which claims are not counted.
type plan struct {
	n        int
	conc     int
	window   time.Duration
	tail     time.Duration
	start    time.Time
	due      []int64 // unix nanoseconds, by task index
	seen     []atomic.Uint32
	late     []int64 // nanoseconds, by task index
	claimed  atomic.Int64
	dups     atomic.Int64
	deadline time.Time
	all      chan struct{}
}

func newPlan(n, conc int, window, tail, lead time.Duration) *plan {
	p := &plan{n: n, conc: conc, window: window, tail: tail, due: make([]int64, n),
		seen: make([]atomic.Uint32, n), late: make([]int64, n), all: make(chan struct{})}
	p.start = time.Now().Add(lead)
	p.deadline = p.start.Add(window + tail)
	rng := rand.New(rand.NewPCG(1, 7))
	for i := range p.due {
		p.due[i] = p.start.Add(time.Duration(rng.Int64N(int64(window)))).UnixNano()
	}
	return p
}

// claim records task i's handler start; claims after the deadline and a
// task's second run are not lateness (the second is counted apart).
func (p *plan) claim(i int) {
	now := time.Now()
	if i < 0 || i >= p.n {
		return
	}
	if !p.seen[i].CompareAndSwap(0, 1) {
		p.dups.Add(1)
		return
	}
	if now.After(p.deadline) {
		return
	}
	p.late[i] = now.UnixNano() - p.due[i]
	p.seen[i].Store(2)
	if p.claimed.Add(1) == int64(p.n) {
		close(p.all)
	}
}

// wait returns once every task is claimed or at the deadline.
func (p *plan) wait() {
	select {
	case <-p.all:
	case <-time.After(time.Until(p.deadline)):
	}
}

func (p *plan) summary(system, config string, submitted time.Duration) result {
	var late []int64
	for i := range p.late {
		if p.seen[i].Load() == 2 {
			late = append(late, p.late[i])
		}
	}
	slices.Sort(late)
	ms := func(ns int64) float64 { return float64(ns/1e5) / 10 }
	r := result{System: system, Tasks: p.n, WindowS: p.window.Seconds(), TailS: p.tail.Seconds(),
		SubmittedS: submitted.Seconds(), Claimed: len(late), Duplicates: p.dups.Load(), Config: config}
	if len(late) > 0 {
		pct := func(f float64) float64 { return ms(late[min(len(late)-1, int(f*float64(len(late))))]) }
		r.P50Ms, r.P99Ms, r.MaxMs = pct(0.5), pct(0.99), ms(late[len(late)-1])
		for _, l := range late {
			if l < 0 {
				r.Early++
			}
		}
		if late[0] < 0 {
			r.EarlyMaxMs = ms(-late[0])
		}
	}
	return r
}

// ready waits until the window opens; it fails if the submission took
// past it, as drover's test does (the figures would be the submission's).
func (p *plan) ready(submitted time.Duration) error {
	if !time.Now().Before(p.start) {
		return fmt.Errorf("the submission took %v, past the window's start: raise -lead", submitted.Round(time.Millisecond))
	}
	time.Sleep(time.Until(p.start))
	return nil
}

func main() {
	system := flag.String("system", "asynq", "asynq, asynq-100ms, river or river-tuned")
	n := flag.Int("n", 150000, "tasks")
	window := flag.Duration("window", 9*time.Second, "the window the due times spread over")
	tail := flag.Duration("tail", time.Minute, "how long after the window's end claims are counted")
	lead := flag.Duration("lead", 0, "from the submission's start to the window's (default 3 s + 1 s per 4,000 tasks)")
	conc := flag.Int("concurrency", 64, "each of the two workers' concurrency")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address (loopback only)")
	pg := flag.String("postgres", "postgres://127.0.0.1:5432/test", "PostgreSQL URL (loopback only)")
	schema := flag.String("schema", "delaybench", "PostgreSQL schema for River (dropped)")
	flag.Parse()
	if *n < 1 || *window <= 0 || *tail < 0 || *conc < 1 {
		fmt.Fprintln(os.Stderr, "delaybench: -n, -window and -concurrency must be positive, -tail not negative")
		os.Exit(2)
	}
	if *lead == 0 {
		*lead = 3*time.Second + time.Duration(*n/4000)*time.Second
	}
	p := newPlan(*n, *conc, *window, *tail, *lead)
	ctx := context.Background()
	var r result
	var err error
	switch *system {
	case "asynq", "asynq-100ms":
		r, err = runAsynq(ctx, p, *system, *redisAddr)
	case "river", "river-tuned":
		r, err = runRiver(ctx, p, *system, *pg, *schema)
	default:
		err = fmt.Errorf("unknown -system %q (asynq, asynq-100ms, river or river-tuned)", *system)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "delaybench:", err)
		os.Exit(1)
	}
	r.LeadS = lead.Seconds()
	_ = json.NewEncoder(os.Stdout).Encode(r)
}
