// Command wfworker is the workflow worker of the chaos tests: queue
// workers of a parents' queue, whose step tasks fan out children and wait
// for a signal, and of the children's queue, each logging every run it
// makes so that the tests can count, across processes, how often each
// child and each step ran.
//
// A parent runs three steps: plan spawns -children children into queue
// kids and waits for all of them; merge reads their outcomes and waits for
// the signal "approval"; act checks it received that signal with the key
// "sig-{parent}" and ends the task with "merged=N sig=KEY". Each run of a
// step or a child appends "S id attempt pid unix-ns" when it starts and
// "E id attempt pid unix-ns" when its work is done, where id is the
// child's id or "{parent}/{step}". A step works -step-time, a child
// -child-time and ends with the JSON string "id attempt pid"; a child
// whose id ends with ".{children-1}" (the last of its parent) waits first
// while the file -gate exists.
//
// With -role emitter it works queue streams instead: each task emits
// -events events to its stream (see emit).
//
// It stops on SIGTERM and exits 0; it exits 70 when it lost its lease.
//
//	wfworker -endpoints 127.0.0.1:2379 -role both -log runs.log
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func main() { os.Exit(run()) }

// cfg is what the flags say.
type cfg struct {
	endpoints, ns, role, logPath, gate string
	ttl, stepTime, childTime           time.Duration
	children, conc                     int
	events                             int
	emitEvery                          time.Duration
}

func run() int {
	var c cfg
	flag.StringVar(&c.endpoints, "endpoints", "127.0.0.1:2379", "etcd endpoints, comma-separated")
	flag.StringVar(&c.ns, "namespace", "drover", "namespace")
	flag.StringVar(&c.role, "role", "both", "parents, kids or both")
	flag.StringVar(&c.logPath, "log", "runs.log", "file the runs are appended to")
	flag.StringVar(&c.gate, "gate", "", "the last child of each parent (role kids), or an emitter a third of the way (role emitter), waits while this file exists")
	flag.DurationVar(&c.ttl, "ttl", 2*time.Second, "lease TTL")
	flag.DurationVar(&c.stepTime, "step-time", 50*time.Millisecond, "how long each step works")
	flag.DurationVar(&c.childTime, "child-time", 50*time.Millisecond, "how long each child works")
	flag.IntVar(&c.children, "children", 10, "children each parent spawns")
	flag.IntVar(&c.conc, "concurrency", 8, "tasks run at once per queue")
	flag.IntVar(&c.events, "events", 300, "events each task of queue streams emits (role emitter)")
	flag.DurationVar(&c.emitEvery, "emit-every", 20*time.Millisecond, "time between two events (role emitter)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer log.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(c.endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	err = work(ctx, cli, c, log)
	switch {
	case errors.Is(err, lease.ErrLost):
		fmt.Fprintln(os.Stderr, "wfworker:", err)
		return 70
	case err != nil:
		fmt.Fprintln(os.Stderr, "wfworker:", err)
		return 1
	}
	return 0
}

// work runs the workers of the role until ctx ends.
func work(ctx context.Context, cli *clientv3.Client, c cfg, log *os.File) error {
	pid := os.Getpid()
	// One write per line: O_APPEND keeps lines of all workers whole.
	mark := func(kind, id string, attempt int) {
		fmt.Fprintf(log, "%s %s %d %d %d\n", kind, id, attempt, pid, time.Now().UnixNano())
	}
	base := queue.WorkerConfig{Namespace: c.ns, Concurrency: c.conc, TTL: c.ttl, BackoffBase: 100 * time.Millisecond,
		BackoffMax: time.Second, ShutdownTimeout: 5 * time.Second}
	var ws []*queue.Worker
	if c.role == "parents" || c.role == "both" {
		store, err := task.NewStore(cli, c.ns)
		if err != nil {
			return err
		}
		wc := base
		wc.Queue = "wf"
		w, err := queue.NewWorker(ctx, cli, wc)
		if err != nil {
			return err
		}
		w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
			return queue.Steps(store, steps(c, t, mark)...)(ctx, t)
		})
		ws = append(ws, w)
	}
	if c.role == "kids" || c.role == "both" {
		wc := base
		wc.Queue = "kids"
		w, err := queue.NewWorker(ctx, cli, wc)
		if err != nil {
			return err
		}
		last := fmt.Sprintf(".%d", c.children-1)
		w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
			mark("S", t.ID, t.Attempt)
			for c.gate != "" && strings.HasSuffix(t.ID, last) && exists(c.gate) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(c.childTime)
			mark("E", t.ID, t.Attempt)
			// "id attempt pid": the tests tell which run's outcome was stored.
			return fmt.Appendf(nil, "%q", fmt.Sprintf("%s %d %d", t.ID, t.Attempt, pid)), nil
		})
		ws = append(ws, w)
	}
	if c.role == "emitter" {
		wc := base
		wc.Queue = "streams"
		w, err := queue.NewWorker(ctx, cli, wc)
		if err != nil {
			return err
		}
		w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) { return emit(ctx, c, t, log, pid) })
		ws = append(ws, w)
	}
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = w.Run(ctx) }()
	}
	wg.Wait()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, w := range ws {
		_ = w.Close(cctx)
	}
	return errors.Join(errs...)
}

// emit is the emitter's handler: it emits -events events of type
// progress, data {"i": i}, one every -emit-every, flushing each, and logs
// "A task attempt i pid unix-ns" for each event whose flush returned nil
// (stored). A failed flush (etcd away) is not fatal: the writer tries the
// events again with the next; the fence's refusal is.
func emit(ctx context.Context, c cfg, t *queue.Task, log *os.File, pid int) ([]byte, error) {
	for i := range c.events {
		// A third of the way, the stream waits while -gate exists: the
		// test's fault comes while the stream is still being written,
		// however slowly its follower got the first events.
		for c.gate != "" && i == c.events/3 && exists(c.gate) && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		err := stream.Emit(ctx, "progress", map[string]int{"i": i})
		if err == nil {
			err = stream.Flush(ctx)
		}
		switch {
		case errors.Is(err, stream.ErrFenced), errors.Is(err, stream.ErrStreamFull), ctx.Err() != nil:
			return nil, fmt.Errorf("emit %d: %w", i, errors.Join(err, ctx.Err()))
		case err == nil:
			fmt.Fprintf(log, "A %s %d %d %d %d\n", t.ID, t.Attempt, i, pid, time.Now().UnixNano())
		}
		time.Sleep(c.emitEvery)
	}
	return []byte("emitted"), nil
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// steps are the parent's steps; each marks its start and end. The work
// ignores the context on purpose, as a blocking model call would: a
// worker paused past its TTL finishes it when continued and tries to
// checkpoint late.
func steps(c cfg, t *queue.Task, mark func(kind, id string, attempt int)) []task.Step {
	run := func(name string, body func(ctx context.Context, s []byte) ([]byte, error)) task.Step {
		return task.Step{Name: name, Run: func(ctx context.Context, s []byte) ([]byte, error) {
			id := t.ID + "/" + name
			mark("S", id, t.Attempt)
			time.Sleep(c.stepTime)
			out, err := body(ctx, s)
			mark("E", id, t.Attempt)
			return out, err
		}}
	}
	return []task.Step{
		run("plan", func(ctx context.Context, s []byte) ([]byte, error) {
			kids := make([]task.Child, c.children)
			for i := range kids {
				kids[i] = task.Child{Queue: "kids", Type: "search", MaxRetries: new(20)}
			}
			return []byte("planned"), task.Spawn(kids, task.SpawnOptions{})
		}),
		run("merge", func(ctx context.Context, s []byte) ([]byte, error) {
			outs, err := task.Children(ctx)
			if err != nil {
				return nil, err
			}
			for _, o := range outs {
				if o.Status != task.ChildSucceeded {
					return nil, fmt.Errorf("child %s ended %s", o.ID, o.Status)
				}
			}
			return fmt.Appendf(nil, "merged=%d", len(outs)), task.WaitSignal("approval", 0)
		}),
		run("act", func(ctx context.Context, s []byte) ([]byte, error) {
			sg, ok := task.ReceivedSignal(ctx)
			if !ok || sg.TimedOut || sg.IdempotencyKey != "sig-"+t.ID {
				return nil, fmt.Errorf("act: received %+v (%t), want the signal sig-%s", sg, ok, t.ID)
			}
			return fmt.Appendf(s, " sig=%s", sg.IdempotencyKey), nil
		}),
	}
}
