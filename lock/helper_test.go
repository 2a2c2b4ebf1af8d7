package lock_test

// Helper processes of the etcd backend (see lock/internal/proctest).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/lock/internal/proctest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func runHelper(mode string) int {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: strings.Split(os.Getenv("H_ENDPOINTS"), ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	ttl, _ := time.ParseDuration(os.Getenv("H_TTL"))
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: os.Getenv("H_NS"), TTL: ttl, HolderID: os.Getenv("H_ID")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer locker.Close(ctx)
	name := os.Getenv("H_LOCK")
	switch mode {
	case "counter":
		return proctest.CountUnder(ctx, locker)
	case "hold":
		l, err := locker.Acquire(ctx, name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		el := l.(*lock.EtcdLock)
		lctx := el.Context()
		fmt.Printf("ACQUIRED %d\n", el.Token())
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if in.Text() == "CHECK" {
				fmt.Printf("RESULT lost=%t\n", errors.Is(el.Err(), lock.ErrLost))
				return 0
			}
			if in.Text() != "WRITE" {
				continue
			}
			// The lock context must end by itself once the process runs
			// again (the renewal deadline passed while it was stopped),
			// before anything here looks at the lock.
			cancelled := false
			select {
			case <-lctx.Done():
				cancelled = true
			case <-time.After(200 * time.Millisecond):
			}
			errNow := el.Err()
			raw, rerr := cli.Txn(ctx).If(el.Cmp()).Then(clientv3.OpPut(os.Getenv("H_DATA"), "stale write")).Commit()
			rawApplied := rerr == nil && raw.Succeeded
			_, ferr := el.Txn(ctx).Then(clientv3.OpPut(os.Getenv("H_DATA"), "stale write")).Commit()
			fmt.Printf("RESULT cancelled=%t lost=%t raw_applied=%t fenced=%t\n",
				cancelled, errors.Is(errNow, lock.ErrLost), rawApplied, errors.Is(ferr, lock.ErrFenced))
			return 0
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 2
}

// startHelper starts a helper process running mode against srv.
func startHelper(t *testing.T, mode string, env ...string) *proctest.Helper {
	t.Helper()
	return proctest.Start(t, mode, append(etcdEnv(), env...)...)
}

// etcdEnv is the helper environment of the etcd backend.
func etcdEnv() []string { return []string{"H_ENDPOINTS=" + strings.Join(srv.Endpoints(), ",")} }
