package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type delayedArgs struct {
	I int `json:"i"`
}

func (delayedArgs) Kind() string { return "delayed" }

type delayedWorker struct {
	river.WorkerDefaults[delayedArgs]
	p *plan
}

func (w *delayedWorker) Work(_ context.Context, job *river.Job[delayedArgs]) error {
	w.p.claim(job.Args.I)
	return nil
}

// runRiver submits p's tasks with InsertMany (1,000 a call) and
// ScheduledAt, starts two Clients of MaxWorkers p.conc (two worker
// processes' worth) and records each Work's start.
func runRiver(ctx context.Context, p *plan, system, url, schemaName string) (result, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	schema := pgx.Identifier{schemaName}.Sanitize()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		return result{}, fmt.Errorf("schema %s: %w", schemaName, err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schemaName})
	if err != nil {
		return result{}, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return result{}, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &delayedWorker{p: p})
	cfg := func(id string) *river.Config {
		c := &river.Config{ID: id, Schema: schemaName, Workers: workers,
			Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: p.conc}},
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
		if os.Getenv("DELAYBENCH_DEBUG") != "" {
			c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		if system == "river-tuned" {
			c.FetchPollInterval, c.FetchCooldown = 100*time.Millisecond, time.Millisecond
		}
		return c
	}
	inserter, err := river.NewClient(riverpgxv5.New(pool), cfg("delaybench-insert"))
	if err != nil {
		return result{}, err
	}
	began := time.Now()
	if err := riverSubmit(ctx, inserter, p); err != nil {
		return result{}, err
	}
	submitted := time.Since(began)
	// A fresh table has no statistics, and without them the scheduler's
	// query took seconds for 3,000 rows (a nested loop over the jobs); a
	// production table has them (autovacuum's analyze), so they are taken.
	if _, err := pool.Exec(ctx, "ANALYZE "+schema+".river_job"); err != nil {
		return result{}, err
	}
	var clients []*river.Client[pgx.Tx]
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, c := range clients {
			_ = c.Stop(sctx)
		}
	}()
	for _, id := range []string{"delaybench-a", "delaybench-b"} {
		c, err := river.NewClient(riverpgxv5.New(pool), cfg(id))
		if err != nil {
			return result{}, err
		}
		if err := c.Start(ctx); err != nil {
			return result{}, err
		}
		clients = append(clients, c)
	}
	if err := p.ready(submitted); err != nil {
		return result{}, err
	}
	p.wait()
	c := cfg("")
	conf := fmt.Sprintf("PostgreSQL, own schema; InsertMany of 1,000 with ScheduledAt; two Clients, MaxWorkers %d each, FetchPollInterval %v, FetchCooldown %v (defaults 1s, 100ms); the leader's scheduler every 5 s with a 5 s look-ahead (not a setting)",
		p.conc, orDefault(c.FetchPollInterval, time.Second), orDefault(c.FetchCooldown, 100*time.Millisecond))
	return p.summary(system, conf, submitted), nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// riverSubmit inserts p's tasks with InsertMany, 1,000 a call.
func riverSubmit(ctx context.Context, inserter *river.Client[pgx.Tx], p *plan) error {
	batch := make([]river.InsertManyParams, 0, 1000)
	for i := range p.n {
		batch = append(batch, river.InsertManyParams{Args: delayedArgs{I: i},
			InsertOpts: &river.InsertOpts{ScheduledAt: time.Unix(0, p.due[i])}})
		if len(batch) == cap(batch) || i == p.n-1 {
			if _, err := inserter.InsertMany(ctx, batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return nil
}
