package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/lock"
)

// LostUpdateConfig says how to play the lost-update experiment: workers that
// increment one thread's counter with and without protection.
type LostUpdateConfig struct {
	Executable  string
	Workers     int
	Invocations int
	// Protect is none (last writer wins, as LangGraph's savers do), cas
	// (optimistic: retry on conflict) or lock (a thread lock held across
	// the read-modify-write, its token fencing the write).
	Protect string
	// Store is etcd or postgres; DatabaseURL names the PostgreSQL.
	Store       string
	DatabaseURL string
	// LockBackend is "" (the demo's etcd), redis://... or redlock://...
	LockBackend string
	// MaxDelay bounds the random "LLM call" between read and write.
	MaxDelay time.Duration
	Timeline io.Writer
}

// LostUpdateResult is what `drover demo lost-update --json` prints.
type LostUpdateResult struct {
	Protect          string `json:"protect"`
	Store            string `json:"store"`
	LockBackend      string `json:"lock_backend,omitempty"`
	Workers          int    `json:"workers"`
	Invocations      int    `json:"invocations"`
	Expected         int    `json:"expected"`
	Actual           int    `json:"actual"`
	LostUpdates      int    `json:"lost_updates"`
	ConflictsRetried int    `json:"conflicts_retried"`
	DurationMillis   int64  `json:"duration_ms"`
}

// RunLostUpdate runs the experiment: worker processes each increment a
// counter in one thread's state Invocations times, with a random delay
// between read and write.
func RunLostUpdate(ctx context.Context, cfg LostUpdateConfig) (LostUpdateResult, error) {
	res := LostUpdateResult{Protect: cfg.Protect, Store: cfg.Store, LockBackend: cfg.LockBackend, Workers: cfg.Workers, Invocations: cfg.Invocations,
		Expected: cfg.Workers * cfg.Invocations}
	if cfg.Timeline == nil {
		cfg.Timeline = io.Discard
	}
	exe := cfg.Executable
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return res, err
		}
	}
	start := time.Now()
	dir, err := os.MkdirTemp("", "drover-lost-update-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	srv, clientAddr, err := embedLostUpdateEtcd(ctx, dir)
	if err != nil {
		return res, err
	}
	defer func() { _ = srv.Close(context.WithoutCancel(ctx)) }()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		return res, err
	}
	defer cli.Close()
	ns := fmt.Sprintf("demo-%08x", rand.Uint32())
	store, closeStore, err := OpenStore(ctx, cfg.Store, cfg.DatabaseURL, cli, ns)
	if err != nil {
		return res, err
	}
	defer closeStore()
	defer func() { _ = store.DeleteThread(context.WithoutCancel(ctx), "counter") }()
	if _, err := store.Put(ctx, checkpoint.Checkpoint{ThreadID: "counter", State: []byte("0"), Metadata: checkpoint.Metadata{Source: "input"}}, nil); err != nil {
		return res, err
	}
	fmt.Fprintf(cfg.Timeline, "drover demo lost-update: %d worker processes x %d invocations on one thread, protect=%s, store=%s\n",
		cfg.Workers, cfg.Invocations, cfg.Protect, cfg.Store)

	res.ConflictsRetried, err = runLostUpdateWorkers(ctx, cfg, exe, clientAddr, ns)
	if err != nil {
		return res, err
	}
	head, err := store.GetLatest(ctx, "counter", "")
	if err != nil {
		return res, err
	}
	res.Actual, _ = strconv.Atoi(string(head.State))
	res.LostUpdates = res.Expected - res.Actual
	res.DurationMillis = time.Since(start).Milliseconds()
	return res, nil
}

// embedLostUpdateEtcd starts the experiment's private embedded etcd with
// its data in dir, and returns it with its client address.
func embedLostUpdateEtcd(ctx context.Context, dir string) (*cluster.Server, string, error) {
	clientAddr, _ := cluster.FreeLoopbackAddr()
	peerAddr, _ := cluster.FreeLoopbackAddr()
	srv, err := cluster.Embed(ctx, cluster.EmbedConfig{DataDir: dir, ClientURL: "http://" + clientAddr, PeerURL: "http://" + peerAddr})
	if err != nil {
		return nil, "", err
	}
	return srv, clientAddr, nil
}

// runLostUpdateWorkers runs the worker processes against the etcd at
// clientAddr until they exit, and returns the conflicts they retried and
// the errors of those that failed.
func runLostUpdateWorkers(ctx context.Context, cfg LostUpdateConfig, exe, clientAddr, ns string) (int, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	conflicts := 0
	for i := 1; i <= cfg.Workers; i++ {
		args := []string{"demo-lost-update-worker", "--etcd-endpoints", clientAddr, "--namespace", ns, "--log-level", "error",
			"--worker-id", fmt.Sprintf("worker-%d", i), "--protect", cfg.Protect, "--store", cfg.Store, "--database-url", cfg.DatabaseURL,
			"--invocations", strconv.Itoa(cfg.Invocations), "--max-delay", cfg.MaxDelay.String()}
		if cfg.LockBackend != "" {
			args = append(args, "--lock-backend", cfg.LockBackend)
		}
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Env = append(os.Environ(), "ETCD_ENDPOINTS=")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var line struct{ Conflicts int }
				if json.Unmarshal(sc.Bytes(), &line) == nil {
					mu.Lock()
					conflicts += line.Conflicts
					mu.Unlock()
				}
			}
			if err := cmd.Wait(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("worker-%d: %w", i, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return conflicts, errors.Join(errs...)
}

// OpenStore opens the checkpoint store named by kind on namespace ns.
func OpenStore(ctx context.Context, kind, databaseURL string, cli interface{}, ns string) (checkpoint.Store, func(), error) {
	return openStore(ctx, kind, databaseURL, cli, ns)
}

// LostUpdateWorker runs one worker's invocations and prints
// {"conflicts":N} when done.
func LostUpdateWorker(ctx context.Context, store checkpoint.Store, locker lock.Locker, protect string, invocations int, maxDelay time.Duration, worker string, out io.Writer) error {
	conflicts := 0
	delay := func() { time.Sleep(time.Duration(rand.Int64N(int64(maxDelay) + 1))) }
	for i := 0; i < invocations; i++ {
		switch protect {
		case "none":
			// Read, think, write on top of whatever is the head now: the
			// last writer wins, as with a saver that takes no precaution.
			head, err := store.GetLatest(ctx, "counter", "")
			if err != nil {
				return err
			}
			n, _ := strconv.Atoi(string(head.State))
			delay()
			for {
				now, err := store.GetLatest(ctx, "counter", "")
				if err != nil {
					return err
				}
				_, err = store.Put(ctx, checkpoint.Checkpoint{ThreadID: "counter", ParentID: now.ID, State: []byte(strconv.Itoa(n + 1)),
					Metadata: checkpoint.Metadata{Source: "loop", Writer: worker}}, nil)
				if !errors.Is(err, checkpoint.ErrConflict) {
					if err != nil {
						return err
					}
					break
				}
			}
		case "cas":
			for {
				head, err := store.GetLatest(ctx, "counter", "")
				if err != nil {
					return err
				}
				n, _ := strconv.Atoi(string(head.State))
				delay()
				_, err = store.Put(ctx, checkpoint.Checkpoint{ThreadID: "counter", ParentID: head.ID, State: []byte(strconv.Itoa(n + 1)),
					Metadata: checkpoint.Metadata{Source: "loop", Writer: worker}}, nil)
				if errors.Is(err, checkpoint.ErrConflict) {
					conflicts++
					continue
				}
				if err != nil {
					return err
				}
				break
			}
		case "lock":
			l, err := locker.Acquire(ctx, "thread-counter")
			if err != nil {
				return err
			}
			head, err := store.GetLatest(ctx, "counter", "")
			if err == nil {
				n, _ := strconv.Atoi(string(head.State))
				delay()
				_, err = store.Put(ctx, checkpoint.Checkpoint{ThreadID: "counter", ParentID: head.ID, State: []byte(strconv.Itoa(n + 1)),
					Metadata: checkpoint.Metadata{Source: "loop", Writer: worker}}, l)
			}
			_ = l.Release(context.WithoutCancel(ctx))
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown protection %q", protect)
		}
	}
	return json.NewEncoder(out).Encode(map[string]int{"conflicts": conflicts})
}
