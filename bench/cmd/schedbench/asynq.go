package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

const asynqQueue = "sched"

// asynqScheduler is one scheduler process, as asynq's users run it: an
// asynq.Scheduler with the tick registered as "@every 1s" (robfig's
// schedule, aligned to whole seconds). Each task it enqueues is written to
// stdout at once, unbuffered: "fire ID UNIXNANO".
func asynqScheduler(c config) error {
	s := asynq.NewScheduler(asynq.RedisClientOpt{Addr: c.redis, DB: c.redisDB}, &asynq.SchedulerOpts{
		LogLevel: asynq.WarnLevel,
		PostEnqueueFunc: func(info *asynq.TaskInfo, err error) {
			now := time.Now()
			if err != nil {
				fmt.Fprintf(os.Stdout, "error %d %s\n", now.UnixNano(), strings.ReplaceAll(err.Error(), "\n", " "))
				return
			}
			fmt.Fprintf(os.Stdout, "fire %s %d\n", info.ID, now.UnixNano())
		},
	})
	spec := fmt.Sprintf("@every %ds", int(c.every/time.Second))
	if _, err := s.Register(spec, asynq.NewTask("tick", nil), asynq.Queue(asynqQueue), asynq.MaxRetry(0)); err != nil {
		return err
	}
	return s.Run()
}

// asynqFires gathers what the schedulers wrote and what the worker ran.
type asynqFires struct {
	mu        sync.Mutex
	logged    map[string]fire
	by        map[string]int // fires per scheduler
	errors    int
	processed map[string]time.Time
}

func (a *asynqFires) line(name string) func(string) {
	return func(l string) {
		f := strings.Fields(l)
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(f) == 3 && f[0] == "fire" {
			ns, err := strconv.ParseInt(f[2], 10, 64)
			if err == nil {
				at := time.Unix(0, ns)
				a.logged[f[1]] = fire{id: f[1], nominal: at.Truncate(time.Second), at: at}
				a.by[name]++
				return
			}
		}
		if len(f) > 0 && f[0] == "error" {
			a.errors++
		}
	}
}

func runAsynq(ctx context.Context, c config) (result, error) {
	opt := asynq.RedisClientOpt{Addr: c.redis, DB: c.redisDB}
	rdb := redis.NewClient(&redis.Options{Addr: c.redis, DB: c.redisDB})
	defer rdb.Close()
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		return result{}, fmt.Errorf("flush Redis db %d: %w", c.redisDB, err)
	}
	a := &asynqFires{logged: map[string]fire{}, by: map[string]int{}, processed: map[string]time.Time{}}
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 4, Queues: map[string]int{asynqQueue: 1}, LogLevel: asynq.WarnLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("tick", func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		a.mu.Lock()
		a.processed[id] = time.Now()
		a.mu.Unlock()
		return nil
	})
	if err := srv.Start(mux); err != nil {
		return result{}, err
	}
	defer srv.Shutdown()

	self, err := executable()
	if err != nil {
		return result{}, err
	}
	var scheds []*child
	for _, name := range []string{"asynq-a", "asynq-b"} {
		ch := newChild(name, self, c.workDir, a.line(name), "-role", "asynq-scheduler", "-name", name,
			"-redis", c.redis, "-redis-db", strconv.Itoa(c.redisDB), "-every", c.every.String())
		if err := ch.start(); err != nil {
			return result{}, err
		}
		scheds = append(scheds, ch)
	}
	// The window opens on the tick after both schedulers have fired.
	var start time.Time
	if err := waitFor(ctx, time.Minute, "both asynq schedulers fire", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.by["asynq-a"] > 0 && a.by["asynq-b"] > 0
	}); err != nil {
		return result{}, err
	}
	start = time.Now().Truncate(time.Second).Add(c.every)
	n := 0
	kills, err := killLoop(ctx, c, start, func() (*child, error) {
		n++
		return scheds[(n-1)%2], nil
	}, func(ch *child) error { return ch.start() })
	if err != nil {
		return result{}, err
	}
	_ = sleepUntil(ctx, time.Now().Add(c.grace))
	for _, ch := range scheds {
		ch.kill()
	}
	srv.Shutdown()

	return a.result(c, start, kills), nil
}

// result counts the fires the schedulers wrote, and the tasks the worker
// ran that no line names.
func (a *asynqFires) result(c config, start time.Time, kills []kill) result {
	a.mu.Lock()
	defer a.mu.Unlock()
	var fires []fire
	for _, f := range a.logged {
		fires = append(fires, f)
	}
	// A scheduler killed between its enqueue and its write leaves a task
	// the worker ran and no line: counted, at the second it ran.
	unlogged, notRun := 0, 0
	for id, at := range a.processed {
		if _, ok := a.logged[id]; !ok {
			unlogged++
			fires = append(fires, fire{id: id, nominal: at.Truncate(time.Second), at: at})
		}
	}
	for id, f := range a.logged {
		if _, ok := a.processed[id]; !ok && !f.nominal.Before(start) && f.nominal.Before(start.Add(c.duration)) {
			notRun++
		}
	}
	r := summarize("asynq", c, start, fires, kills)
	r.Notes["schedulers"] = 2
	r.Notes["fires_by_scheduler"] = a.by
	r.Notes["enqueue_errors"] = a.errors
	r.Notes["worker_ran"] = len(a.processed)
	r.Notes["ran_not_logged"] = unlogged
	r.Notes["logged_not_ran_in_window"] = notRun
	r.Notes["nominal"] = "the whole second the scheduler enqueued in (robfig @every aligns to whole seconds)"
	return r
}
