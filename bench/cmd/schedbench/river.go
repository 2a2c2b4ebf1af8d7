package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type tickArgs struct{}

func (tickArgs) Kind() string { return "tick" }

type tickWorker struct {
	river.WorkerDefaults[tickArgs]
}

func (tickWorker) Work(context.Context, *river.Job[tickArgs]) error { return nil }

// riverClient is one River client process, as River's users run periodic
// jobs: every client of the cluster configures the same periodic job
// (an ID, so River knows it across clients; RunOnStart off; unique by
// period, River's hedge against a tick inserted twice) and works the
// queue; the elected leader alone inserts the jobs.
func riverClient(c config) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.postgres)
	if err != nil {
		return err
	}
	defer pool.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, tickWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID:      c.name,
		Schema:  c.schema,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers: workers,
		PeriodicJobs: []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(c.every),
			func() (river.JobArgs, *river.InsertOpts) {
				return tickArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: c.every}}
			}, &river.PeriodicJobOpts{ID: "tick", RunOnStart: false})},
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	<-client.Stopped()
	return errors.New("client stopped")
}

func runRiver(ctx context.Context, c config) (result, error) {
	pool, err := pgxpool.New(ctx, c.postgres)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	schema := pgx.Identifier{c.schema}.Sanitize()
	if err := riverSchema(ctx, pool, c.schema); err != nil {
		return result{}, err
	}
	self, err := executable()
	if err != nil {
		return result{}, err
	}
	byName := map[string]*child{}
	for _, name := range []string{"river-a", "river-b"} {
		ch := newChild(name, self, c.workDir, nil, "-role", "river-client", "-name", name,
			"-postgres", c.postgres, "-schema", c.schema, "-every", c.every.String())
		if err := ch.start(); err != nil {
			return result{}, err
		}
		byName[name] = ch
	}
	// The window opens at the first tick's nominal time.
	var first *time.Time
	if err := waitFor(ctx, time.Minute, "River's first periodic job", func() bool {
		err := pool.QueryRow(ctx, "SELECT min(scheduled_at) FROM "+schema+".river_job WHERE kind = 'tick'").Scan(&first)
		return err == nil && first != nil
	}); err != nil {
		return result{}, err
	}
	start := *first
	leader := func() (*child, error) {
		var id string
		err := waitFor(ctx, time.Minute, "a River leader", func() bool {
			return pool.QueryRow(ctx, "SELECT leader_id FROM "+schema+".river_leader").Scan(&id) == nil && byName[id] != nil
		})
		return byName[id], err
	}
	kills, err := killLoop(ctx, c, start, leader, func(ch *child) error { return ch.start() })
	if err != nil {
		return result{}, err
	}
	_ = sleepUntil(ctx, time.Now().Add(c.grace))
	for _, ch := range byName {
		ch.kill()
	}
	rows, err := pool.Query(ctx, "SELECT id, scheduled_at, created_at, state FROM "+schema+".river_job WHERE kind = 'tick'")
	if err != nil {
		return result{}, err
	}
	var fires []fire
	states := map[string]int{}
	for rows.Next() {
		var id int64
		var f fire
		var state string
		if err := rows.Scan(&id, &f.nominal, &f.at, &state); err != nil {
			return result{}, err
		}
		f.id = strconv.FormatInt(id, 10)
		fires = append(fires, f)
		states[state]++
	}
	if err := rows.Err(); err != nil {
		return result{}, err
	}
	r := summarize("river", c, start, fires, kills)
	r.Notes["clients"] = 2
	r.Notes["job_states"] = states
	r.Notes["nominal"] = "the job's scheduled_at (the leader's next run time); lateness is created_at minus it, early by up to River's 100 ms margin"
	r.Notes["config"] = "PeriodicInterval, ID tick, RunOnStart false, UniqueOpts ByPeriod = every, default elector (leader TTL 15 s)"
	return r, nil
}

// riverSchema drops the schema and migrates River's tables into it anew.
func riverSchema(ctx context.Context, pool *pgxpool.Pool, name string) error {
	schema := pgx.Identifier{name}.Sanitize()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("schema %s: %w", name, err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: name})
	if err != nil {
		return err
	}
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}
