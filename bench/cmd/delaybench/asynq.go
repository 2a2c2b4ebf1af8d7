package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// runAsynq submits p's tasks with ProcessAt, 64 Enqueue calls at a time
// (asynq's client has no batch insert), starts two Servers of p.conc as
// two worker processes would be, and records each handler's start.
func runAsynq(ctx context.Context, p *plan, system, addr string) (result, error) {
	opt := asynq.RedisClientOpt{Addr: addr, DB: 9}
	rdb := redis.NewClient(&redis.Options{Addr: addr, DB: 9})
	defer rdb.Close()
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		return result{}, err
	}
	defer rdb.FlushDB(context.Background())
	client := asynq.NewClient(opt)
	defer client.Close()
	began := time.Now()
	if err := asynqSubmit(client, p); err != nil {
		return result{}, err
	}
	submitted := time.Since(began)
	check := 5 * time.Second
	if system == "asynq-100ms" {
		check = 100 * time.Millisecond
	}
	mux := asynq.NewServeMux()
	mux.HandleFunc("delayed", func(_ context.Context, t *asynq.Task) error {
		i, err := strconv.Atoi(string(t.Payload()))
		if err != nil {
			return fmt.Errorf("payload %q: %w", t.Payload(), err)
		}
		p.claim(i)
		return nil
	})
	var servers []*asynq.Server
	for range 2 {
		srv := asynq.NewServer(opt, asynq.Config{Concurrency: p.conc, DelayedTaskCheckInterval: check, LogLevel: asynq.WarnLevel})
		if err := srv.Start(mux); err != nil {
			return result{}, err
		}
		servers = append(servers, srv)
	}
	defer func() {
		for _, s := range servers {
			s.Shutdown()
		}
	}()
	if err := p.ready(submitted); err != nil {
		return result{}, err
	}
	p.wait()
	cfg := fmt.Sprintf("Redis appendonly everysec; Enqueue with ProcessAt from 64 goroutines; two Servers, Concurrency %d each, DelayedTaskCheckInterval %v", p.conc, check)
	r := p.summary(system, cfg, submitted)
	r.Notes = map[string]any{"due_resolution": "asynq scores a scheduled task by its due time in whole seconds (ProcessAt's Unix()) and forwards it once that second has begun: up to 1 s early"}
	return r, nil
}

func asynqSubmit(client *asynq.Client, p *plan) error {
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= p.n {
					return
				}
				t := asynq.NewTask("delayed", []byte(strconv.Itoa(i)))
				if _, err := client.Enqueue(t, asynq.ProcessAt(time.Unix(0, p.due[i])), asynq.MaxRetry(3)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
