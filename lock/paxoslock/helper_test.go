package paxoslock_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/droverhq/drover/lock/internal/proctest"
	"github.com/droverhq/drover/lock/paxoslock"
)

// runHelper runs helper process mode (see lock/internal/proctest): it
// holds a lock of the paxos group at H_PAXOS until told to CHECK it, then
// reports whether it knows the lock is lost, or counts under the lock.
func runHelper(mode string) int {
	ctx := context.Background()
	ttl, _ := time.ParseDuration(os.Getenv("H_TTL"))
	locker, err := paxoslock.New(paxoslock.Config{Endpoints: strings.Split(os.Getenv("H_PAXOS"), ","), Namespace: os.Getenv("H_NS"), TTL: ttl, HolderID: os.Getenv("H_ID")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = locker.Close(ctx) }()
	if mode == "paxos-counter" {
		return proctest.CountUnder(ctx, locker)
	}
	return proctest.HoldUntilChecked(ctx, locker)
}
