package cli

import (
	"github.com/droverhq/drover/lock/paxoslock"
	"github.com/droverhq/drover/lock/redislock"
	"github.com/droverhq/drover/paxos/client"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/proc"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// Environment passed to the command that lock run starts.
const (
	EnvLockName  = "DROVER_LOCK_NAME"
	EnvLockToken = "DROVER_LOCK_TOKEN"
)

func (a *app) lockCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lock",
		Short: "Run commands under distributed locks; see who holds what",
		Example: `  drover lock run nightly-report -- ./report.sh
  drover lock status nightly-report --json
  drover lock run nightly-report --lock-backend redis://127.0.0.1:6379/0 -- ./report.sh
  drover lock run nightly-report --lock-backend paxos://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102 -- ./report.sh
  drover lock list`,
	}
	cmd.PersistentFlags().StringVar(&a.lockBackend, "lock-backend", "etcd", "where locks live: etcd, redis://HOST:PORT/DB, redlock://HOST:PORT,HOST:PORT,HOST:PORT, or paxos://HOST:PORT,HOST:PORT,HOST:PORT (drover paxos serve)")
	cmd.AddCommand(a.lockRunCommand(), a.lockStatusCommand(), a.lockListCommand())
	return cmd
}

// checkLockName validates a lock name given as the NAME argument.
func checkLockName(name string) error {
	return drover.Rename(lock.CheckName(name), "lock name")
}

func (a *app) lockRunCommand() *cobra.Command {
	var (
		ttl      time.Duration
		wait     time.Duration
		grace    time.Duration
		holderID string
	)
	cmd := &cobra.Command{
		Use:   "run NAME [flags] -- CMD [ARGS...]",
		Short: "Run CMD while holding lock NAME, like flock across machines",
		Long: `Run CMD while holding lock NAME. The lock is bound to a lease with --ttl: if
this process dies or is cut off from etcd for longer than that, the lock frees
itself and the next waiter takes it.

CMD gets DROVER_LOCK_NAME and DROVER_LOCK_TOKEN in its environment. The token
is a fencing token: it strictly increases each time NAME changes hands, so CMD
can hand it to whatever it writes and have stale writes refused.

CMD runs in its own process group. SIGINT and SIGTERM sent to drover are
forwarded to it. If the lock is lost while CMD runs, CMD's process group gets
SIGTERM, then SIGKILL after --grace, and drover exits 70.

Exit codes: CMD's own exit code (128+N if it died of signal N); 75 if the lock
is held by someone else (--wait 0) or the wait ran out; 70 if the lock was
lost; 69 if etcd cannot be reached; 2 for bad flags; 127 if CMD is not found.`,
		Example: `  drover lock run nightly-report -- ./report.sh --date today
  drover lock run migrate --wait 0 -- ./migrate.sh          # try once; exit 75 if busy
  drover lock run reindex --ttl 30s --wait 10m -- sh -c 'reindex --fence "$DROVER_LOCK_TOKEN"'`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if len(args) == 0 || dash == 0 {
				return usageError{errors.New("lock run needs NAME, then -- and the command to run (see 'drover lock run --help')")}
			}
			if dash < 0 || dash >= len(args) {
				return usageError{errors.New("lock run needs the command to run after -- (see 'drover lock run --help')")}
			}
			if dash != 1 {
				return usageError{fmt.Errorf("lock run takes one NAME before --, got %d arguments", dash)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name, argv := args[0], args[1:]
			if err := a.checkGlobal(); err != nil {
				return err
			}
			if err := checkLockName(name); err != nil {
				return err
			}
			if err := lease.CheckTTL("--ttl", ttl); err != nil {
				return err
			}
			if wait < 0 {
				return &drover.InputError{Field: "--wait", Value: wait, Rule: "must be 0 (try once) or positive"}
			}
			if grace <= 0 {
				return &drover.InputError{Field: "--grace", Value: grace, Rule: "must be positive"}
			}
			if holderID != "" {
				if err := keyspace.CheckName("--holder-id", holderID); err != nil {
					return err
				}
			}
			return a.lockRun(cmd.Context(), name, argv, ttl, wait, grace, holderID)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&ttl, "ttl", 15*time.Second, "lease TTL: how long the lock outlives this process if it dies or is cut off (1s to 24h)")
	f.DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the lock; 0 tries once")
	f.DurationVar(&grace, "grace", 10*time.Second, "after the lock is lost, time between SIGTERM and SIGKILL for CMD")
	f.StringVar(&holderID, "holder-id", "", "name recorded as the holder (default host:pid)")
	return cmd
}

func (a *app) lockRun(ctx context.Context, name string, argv []string, ttl, wait, grace time.Duration, holderID string) error {
	// Signals are ours from here: while waiting they abort the wait, while
	// CMD runs they are forwarded to it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waiting, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-sigs:
			cancel()
		case <-waiting:
		}
	}()
	defer func() {
		select {
		case <-waiting:
		default:
			close(waiting)
		}
		<-watched
	}()

	locker, closeLocker, err := a.locker(ctx, ttl, holderID)
	if err != nil {
		return err
	}
	defer closeLocker()

	l, err := locker.TryAcquire(ctx, name)
	if errors.Is(err, lock.ErrHeld) && wait > 0 {
		fmt.Fprintf(a.stderr, "drover: %v; waiting up to %s\n", err, wait)
		wctx, wcancel := context.WithTimeout(ctx, wait)
		l, err = locker.Acquire(wctx, name)
		wcancel()
	}
	if err != nil {
		if errors.Is(err, lock.ErrHeld) {
			if ctx.Err() != nil {
				return withCode(130, fmt.Errorf("interrupted while waiting for lock %q", name))
			}
			hint := "try again later or raise --wait"
			if wait == 0 {
				hint = "try again later, or pass --wait to wait for it"
			}
			return withCode(ExitBusy, fmt.Errorf("%w; %s", err, hint))
		}
		return err
	}
	lctx := l.Context()
	// From here signals go to CMD, unless one came while the lock was taken.
	close(waiting)
	<-watched
	if ctx.Err() != nil {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		_ = l.Release(rctx)
		return withCode(130, fmt.Errorf("interrupted before %s started", argv[0]))
	}
	return a.runHolding(l, lctx, argv, grace, sigs)
}

// runHolding runs argv while l is held, and returns CMD's exit code as an
// exitError (or nil for 0).
func (a *app) runHolding(l lock.Lock, lctx context.Context, argv []string, grace time.Duration, sigs chan os.Signal) error {
	child := exec.Command(argv[0], argv[1:]...)
	child.Env = append(os.Environ(), EnvLockName+"="+l.Name(), EnvLockToken+"="+strconv.FormatInt(l.Token(), 10))
	child.Stdin, child.Stdout, child.Stderr = a.stdin, a.stdout, a.stderr
	waitErr, stopped, startErr := proc.Supervise(child, sigs, lctx.Done(), grace, func() {
		fmt.Fprintf(a.stderr, "drover: %v; stopping %s (SIGTERM, SIGKILL after %s)\n", context.Cause(lctx), argv[0], grace)
	})
	if stopped {
		return withCode(ExitLockLost, fmt.Errorf("lock %q was lost while %s ran; it was stopped", l.Name(), argv[0]))
	}
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Release(rctx); err != nil && !errors.Is(err, lock.ErrNotHeld) {
		fmt.Fprintf(a.stderr, "drover: release lock %q: %v (it frees itself when the lease ends)\n", l.Name(), err)
	}
	if startErr != nil {
		return startFailure(argv[0], startErr)
	}
	return childExit(waitErr)
}

// lockStatusJSON is the JSON form of a lock's status.
type lockStatusJSON struct {
	Name       string       `json:"name"`
	Held       bool         `json:"held"`
	Holder     *lock.Holder `json:"holder,omitempty"`
	Token      int64        `json:"token,omitempty"`
	TTLSeconds *float64     `json:"ttl_left_seconds,omitempty"`
	Waiters    int          `json:"waiters"`
}

func statusJSON(st lock.Status) lockStatusJSON {
	out := lockStatusJSON{Name: st.Name, Held: st.Held}
	if st.Held {
		h := st.Holder
		out.Holder, out.Token, out.Waiters = &h, st.Token, st.Waiters
		if st.TTL >= 0 {
			s := st.TTL.Seconds()
			out.TTLSeconds = &s
		}
	}
	return out
}

func (a *app) lockStatusCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show who holds lock NAME, with its token and TTL left, or that it is free",
		Example: `  drover lock status nightly-report
  drover lock status nightly-report --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.checkGlobal(); err != nil {
				return err
			}
			if err := checkLockName(args[0]); err != nil {
				return err
			}
			locker, done, err := a.inspector(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			st, err := locker.Status(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(statusJSON(st))
			}
			if !st.Held {
				fmt.Fprintf(a.stdout, "lock %s: free\n", st.Name)
				return nil
			}
			fmt.Fprintf(a.stdout, "lock %s: held\n", st.Name)
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "  holder:\t%s\n", st.Holder.ID)
			fmt.Fprintf(tw, "  host/pid:\t%s / %d\n", st.Holder.Host, st.Holder.PID)
			fmt.Fprintf(tw, "  since:\t%s\n", st.Holder.AcquiredAt.Format(time.RFC3339))
			fmt.Fprintf(tw, "  token:\t%d\n", st.Token)
			fmt.Fprintf(tw, "  ttl left:\t%s\n", ttlText(st.TTL))
			fmt.Fprintf(tw, "  waiters:\t%d\n", st.Waiters)
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func ttlText(d time.Duration) string {
	if d < 0 {
		return "unknown"
	}
	return d.String()
}

func (a *app) lockListCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List every held lock in the namespace",
		Example: `  drover lock list
  drover lock list --json --namespace staging`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.checkGlobal(); err != nil {
				return err
			}
			locker, done, err := a.inspector(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			list, err := locker.List(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]lockStatusJSON, 0, len(list))
				for _, st := range list {
					out = append(out, statusJSON(st))
				}
				return json.NewEncoder(a.stdout).Encode(out)
			}
			if len(list) == 0 {
				fmt.Fprintf(a.stdout, "no locks held in namespace %s\n", a.namespace)
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHOLDER\tHOST\tPID\tTOKEN\tTTL LEFT\tWAITERS\tSINCE")
			for _, st := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%d\t%s\n", st.Name, st.Holder.ID, st.Holder.Host, st.Holder.PID,
					st.Token, ttlText(st.TTL), st.Waiters, st.Holder.AcquiredAt.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// locker opens the lock backend named by --lock-backend: etcd (the
// default), redis://HOST:PORT/DB, redlock://HOST:PORT,... over several
// independent Redis servers, or paxos://HOST:PORT,... (a drover paxos
// group). The returned function closes it.
func (a *app) locker(ctx context.Context, ttl time.Duration, holderID string) (lock.Locker, func(), error) {
	switch b := a.lockBackend; {
	case b == "" || b == "etcd":
		cli, err := a.connect(ctx)
		if err != nil {
			return nil, nil, err
		}
		locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: a.namespace, TTL: ttl, HolderID: holderID, Logger: a.logger})
		if err != nil {
			cli.Close()
			return nil, nil, err
		}
		return locker, func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = locker.Close(cctx)
			cli.Close()
		}, nil
	case strings.HasPrefix(b, "redis://"):
		opt, err := redis.ParseURL(b)
		if err != nil {
			return nil, nil, &drover.InputError{Field: "--lock-backend", Value: b, Rule: "must be etcd or redis://HOST:PORT/DB: " + err.Error()}
		}
		rdb := redis.NewClient(opt)
		pctx, cancel := context.WithTimeout(ctx, a.dialTimeout)
		defer cancel()
		if err := rdb.Ping(pctx).Err(); err != nil {
			rdb.Close()
			return nil, nil, withCode(ExitUnavailable, fmt.Errorf("cannot reach redis at %s (tried for %s: %v): start Redis or fix --lock-backend", opt.Addr, a.dialTimeout, err))
		}
		locker, err := redislock.New(rdb, redislock.Config{Namespace: a.namespace, TTL: ttl, HolderID: holderID, Logger: a.logger})
		if err != nil {
			rdb.Close()
			return nil, nil, err
		}
		return locker, func() { rdb.Close() }, nil
	case strings.HasPrefix(b, "redlock://"):
		var hosts []string
		for _, h := range strings.Split(strings.TrimPrefix(b, "redlock://"), ",") {
			if h = strings.TrimSpace(h); h != "" {
				hosts = append(hosts, h)
			}
		}
		if len(hosts) < 3 || len(hosts)%2 == 0 {
			return nil, nil, &drover.InputError{Field: "--lock-backend", Value: b, Rule: "redlock:// needs an odd number, at least 3, of independent Redis servers"}
		}
		var clients []redis.UniversalClient
		closeAll := func() {
			for _, c := range clients {
				_ = c.Close()
			}
		}
		reachable := 0
		for _, h := range hosts {
			c := redis.NewClient(&redis.Options{Addr: h, DialTimeout: a.dialTimeout})
			clients = append(clients, c)
			pctx, cancel := context.WithTimeout(ctx, a.dialTimeout)
			if c.Ping(pctx).Err() == nil {
				reachable++
			}
			cancel()
		}
		if len(clients) > 0 && reachable < len(clients)/2+1 {
			closeAll()
			return nil, nil, withCode(ExitUnavailable, fmt.Errorf("only %d of the %d Redis servers in %s answered: Redlock needs a majority", reachable, len(clients), b))
		}
		locker, err := redislock.NewRedlock(clients, redislock.RedlockConfig{Namespace: a.namespace, TTL: ttl, HolderID: holderID, Logger: a.logger})
		if err != nil {
			closeAll()
			return nil, nil, drover.Rename(err, "--lock-backend")
		}
		return locker, closeAll, nil
	case strings.HasPrefix(b, "paxos://"):
		return a.paxosLocker(ctx, b, ttl, holderID)
	default:
		return nil, nil, &drover.InputError{Field: "--lock-backend", Value: b, Rule: "must be etcd, redis://HOST:PORT/DB, redlock://HOST:PORT,HOST:PORT,HOST:PORT or paxos://HOST:PORT,HOST:PORT,HOST:PORT"}
	}
}

// paxosLocker opens a locker on the drover paxos group at
// paxos://HOST:PORT,...: locks of the default namespace keep their names
// there, others are NAMESPACE:NAME. It fails with exit 69 unless some node
// answers.
func (a *app) paxosLocker(ctx context.Context, b string, ttl time.Duration, holderID string) (lock.Locker, func(), error) {
	var hosts []string
	for _, h := range strings.Split(strings.TrimPrefix(b, "paxos://"), ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	rule := "paxos:// needs the API addresses of the group's nodes, HOST:PORT comma-separated"
	if len(hosts) == 0 {
		return nil, nil, &drover.InputError{Field: "--lock-backend", Value: b, Rule: rule}
	}
	for _, h := range hosts {
		if _, err := client.ParseEndpoint(h); err != nil {
			return nil, nil, &drover.InputError{Field: "--lock-backend", Value: b, Rule: rule + ": " + err.Error()}
		}
	}
	ns := a.namespace
	if ns == keyspace.DefaultNamespace {
		ns = ""
	}
	locker, err := paxoslock.New(paxoslock.Config{Endpoints: hosts, Namespace: ns, TTL: ttl, HolderID: holderID, Logger: a.logger})
	if err != nil {
		return nil, nil, drover.Rename(err, "--lock-backend")
	}
	c, _ := client.New(client.Config{Endpoints: hosts})
	defer func() { _ = c.Close(ctx) }()
	pctx, cancel := context.WithTimeout(ctx, a.dialTimeout)
	defer cancel()
	if _, err := c.Status(pctx); err != nil {
		_ = locker.Close(ctx)
		return nil, nil, withCode(ExitUnavailable, fmt.Errorf("cannot reach any node of the paxos group at %s (tried for %s: %v): start it (drover paxos serve) or fix --lock-backend",
			strings.Join(hosts, ","), a.dialTimeout, err))
	}
	return locker, func() { _ = locker.Close(context.Background()) }, nil
}

// inspector returns a locker for reading lock state. Reading needs no lease,
// but the etcd locker always has one; it is short and revoked at once.
func (a *app) inspector(ctx context.Context) (lock.Locker, func(), error) {
	return a.locker(ctx, 5*time.Second, "")
}

// startFailure turns a failure to start a program into the shell's exit
// codes: 127 when it does not exist, 126 otherwise.
func startFailure(name string, err error) error {
	code := 126
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		code = 127
	}
	return withCode(code, fmt.Errorf("start %s: %w", name, err))
}

// childExit maps a program's end to drover's exit: its code, or 128+signal.
func childExit(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return withCode(128+int(ws.Signal()), errors.New(""))
		}
		return withCode(ee.ExitCode(), errors.New(""))
	}
	return err
}

// quietRedis drops go-redis's own log lines (connection pool retries): the
// errors that matter reach the user through drover's messages.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quietRedis{}) }
