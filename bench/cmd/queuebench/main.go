// Command queuebench runs the same no-op workload through the task queues
// users would pick instead of drover's: hibiken/asynq on the local Redis and
// riverqueue/river on the local PostgreSQL. It prints one JSON line per run
// with the insert rate and the processing rate. drover's own figures come
// from `drover submit` and `drover worker --handler noop` (see
// bench/run-queue.sh), in the same run.
//
// It lives in its own module so that drover's dependencies stay drover's.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type result struct {
	System      string  `json:"system"`
	Tasks       int     `json:"tasks"`
	Concurrency int     `json:"concurrency"`
	InsertPerS  float64 `json:"insert_per_s"`
	ProcessPerS float64 `json:"process_per_s"`
}

func main() {
	system := flag.String("system", "asynq", "asynq, river or river-tuned (FetchCooldown 1ms)")
	n := flag.Int("n", 100000, "tasks")
	conc := flag.Int("concurrency", 64, "workers")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address (loopback only)")
	pg := flag.String("postgres", "postgres://127.0.0.1:5432/test", "PostgreSQL URL (loopback only)")
	flag.Parse()
	ctx := context.Background()
	var r result
	var err error
	switch *system {
	case "asynq":
		r, err = runAsynq(ctx, *redisAddr, *n, *conc)
	case "river", "river-tuned":
		r, err = runRiver(ctx, *pg, *n, *conc, *system == "river-tuned")
	default:
		err = fmt.Errorf("unknown -system %q", *system)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "queuebench:", err)
		os.Exit(1)
	}
	r.System, r.Tasks, r.Concurrency = *system, *n, *conc
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

func runAsynq(ctx context.Context, addr string, n, conc int) (result, error) {
	opt := asynq.RedisClientOpt{Addr: addr, DB: 9}
	rdb := redis.NewClient(&redis.Options{Addr: addr, DB: 9})
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		return result{}, err
	}
	defer rdb.Close()
	client := asynq.NewClient(opt)
	defer client.Close()
	start := time.Now()
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, 64)
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if _, err := client.Enqueue(asynq.NewTask("noop", nil), asynq.MaxRetry(3)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return result{}, err
	}
	inserted := time.Since(start)
	var done atomic.Int64
	all := make(chan struct{})
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: conc, LogLevel: asynq.WarnLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(ctx context.Context, t *asynq.Task) error {
		if done.Add(1) == int64(n) {
			close(all)
		}
		return nil
	})
	start = time.Now()
	if err := srv.Start(mux); err != nil {
		return result{}, err
	}
	<-all
	processed := time.Since(start)
	srv.Shutdown()
	return result{InsertPerS: float64(n) / inserted.Seconds(), ProcessPerS: float64(n) / processed.Seconds()}, nil
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	done *atomic.Int64
	n    int64
	all  chan struct{}
}

func (w *noopWorker) Work(ctx context.Context, job *river.Job[noopArgs]) error {
	if w.done.Add(1) == w.n {
		close(w.all)
	}
	return nil
}

func runRiver(ctx context.Context, url string, n, conc int, tuned bool) (result, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return result{}, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return result{}, err
	}
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		return result{}, err
	}
	w := &noopWorker{done: new(atomic.Int64), n: int64(n), all: make(chan struct{})}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	cfg := &river.Config{Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: conc}}, Workers: workers}
	if tuned {
		cfg.FetchCooldown = time.Millisecond
	}
	client, err := river.NewClient(driver, cfg)
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	batch := make([]river.InsertManyParams, 0, 1000)
	for i := 0; i < n; i++ {
		batch = append(batch, river.InsertManyParams{Args: noopArgs{}})
		if len(batch) == cap(batch) || i == n-1 {
			if _, err := client.InsertMany(ctx, batch); err != nil {
				return result{}, err
			}
			batch = batch[:0]
		}
	}
	inserted := time.Since(start)
	start = time.Now()
	if err := client.Start(ctx); err != nil {
		return result{}, err
	}
	<-w.all
	processed := time.Since(start)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = client.Stop(sctx)
	return result{InsertPerS: float64(n) / inserted.Seconds(), ProcessPerS: float64(n) / processed.Seconds()}, nil
}
