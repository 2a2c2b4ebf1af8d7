// Command schedbench measures what a leader's crash costs a schedule that
// fires every second: how many ticks fire more than once, how many do not
// fire at all, and how late the others are. It runs one system per run,
// the same scenario for each:
//
//   - drover: a schedule `--every 1s` on a 3-member `drover server`
//     cluster whose etcd leader is SIGKILLed every -kill-every and
//     started again on its data dir a few seconds later;
//   - asynq: two asynq schedulers registering "@every 1s" on the local
//     Redis, one of them SIGKILLed every -kill-every and started again;
//   - river: two River clients with a periodic job every second on the
//     local PostgreSQL, the elected leader SIGKILLed every -kill-every and
//     started again.
//
// The schedulers run in child processes (this command started again with
// a hidden -role flag), so that a SIGKILL is a real crash. It prints one
// JSON line. Loopback addresses only.
//
//	schedbench -system asynq -duration 10m -kill-every 1m
//	schedbench -system drover -drover-bin /tmp/drover -duration 10m
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

type config struct {
	system    string
	duration  time.Duration
	killEvery time.Duration
	down      time.Duration
	every     time.Duration
	grace     time.Duration
	redis     string
	redisDB   int
	postgres  string
	schema    string
	droverBin string
	catchup   string
	workDir   string
	role      string
	name      string
}

func main() {
	var c config
	flag.StringVar(&c.system, "system", "drover", "drover, asynq or river")
	flag.DurationVar(&c.duration, "duration", 10*time.Minute, "how long the schedule is measured")
	flag.DurationVar(&c.killEvery, "kill-every", time.Minute, "SIGKILL the leader (asynq: one scheduler) this often")
	flag.DurationVar(&c.down, "down", 5*time.Second, "how long a killed process stays down before it is started again")
	flag.DurationVar(&c.every, "every", time.Second, "the schedule's interval (whole seconds)")
	flag.DurationVar(&c.grace, "grace", 10*time.Second, "wait this long after the run for late fires")
	flag.StringVar(&c.redis, "redis", "127.0.0.1:6379", "Redis address for asynq (loopback only)")
	flag.IntVar(&c.redisDB, "redis-db", 11, "Redis database number for asynq, flushed first")
	flag.StringVar(&c.postgres, "postgres", "postgres://127.0.0.1:5432/test", "PostgreSQL URL for River (loopback only)")
	flag.StringVar(&c.schema, "schema", "schedbench", "PostgreSQL schema for River's tables, dropped and migrated first")
	flag.StringVar(&c.droverBin, "drover-bin", "drover", "the drover binary")
	flag.StringVar(&c.catchup, "catchup", "all", "drover's --catchup policy for the schedule (window 1h)")
	flag.StringVar(&c.workDir, "work-dir", "", "directory for data and logs (default: a new temporary one)")
	flag.StringVar(&c.role, "role", "", "internal: the child process's role")
	flag.StringVar(&c.name, "name", "", "internal: the child process's name")
	flag.Parse()

	if c.role != "" {
		if err := runRole(c); err != nil {
			fmt.Fprintln(os.Stderr, "schedbench", c.role, c.name+":", err)
			os.Exit(1)
		}
		return
	}
	if err := c.check(); err != nil {
		fmt.Fprintln(os.Stderr, "schedbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	r, err := run(ctx, c)
	stop()
	killAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "schedbench:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

func (c *config) check() error {
	switch {
	case c.system != "drover" && c.system != "asynq" && c.system != "river":
		return fmt.Errorf("-system: %q is not drover, asynq or river", c.system)
	case c.every < time.Second || c.every%time.Second != 0:
		return fmt.Errorf("-every: %s is not a whole number of seconds", c.every)
	case c.duration < c.every:
		return fmt.Errorf("-duration: %s is shorter than -every", c.duration)
	case c.killEvery <= c.down:
		return fmt.Errorf("-kill-every: %s is not longer than -down %s", c.killEvery, c.down)
	}
	if c.workDir == "" {
		d, err := os.MkdirTemp("", "schedbench-")
		if err != nil {
			return err
		}
		c.workDir = d
	}
	return os.MkdirAll(c.workDir, 0o755)
}

func runRole(c config) error {
	switch c.role {
	case "asynq-scheduler":
		return asynqScheduler(c)
	case "river-client":
		return riverClient(c)
	}
	return fmt.Errorf("-role: unknown role %q", c.role)
}

func run(ctx context.Context, c config) (result, error) {
	switch c.system {
	case "asynq":
		return runAsynq(ctx, c)
	case "river":
		return runRiver(ctx, c)
	}
	return runDrover(ctx, c)
}
