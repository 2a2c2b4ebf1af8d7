package redislock_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/lock/internal/proctest"
	"github.com/droverhq/drover/lock/redislock"
	"github.com/redis/go-redis/v9"
)

// runHelper runs helper process mode (see lock/internal/proctest): it
// holds a Redis or Redlock lock until told to CHECK it, then reports
// whether it knows the lock is lost, or counts under the lock.
func runHelper(mode string) int {
	ctx := context.Background()
	ttl, _ := time.ParseDuration(os.Getenv("H_TTL"))
	var clients []redis.UniversalClient
	for _, addr := range strings.Split(os.Getenv("H_REDIS"), ",") {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		clients = append(clients, c)
	}
	var locker lock.Locker
	var err error
	if mode == "redlock-hold" || mode == "redlock-counter" {
		locker, err = redislock.NewRedlock(clients, redislock.RedlockConfig{Namespace: os.Getenv("H_NS"), TTL: ttl, HolderID: os.Getenv("H_ID")})
	} else {
		locker, err = redislock.New(clients[0], redislock.Config{Namespace: os.Getenv("H_NS"), TTL: ttl, HolderID: os.Getenv("H_ID")})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if strings.HasSuffix(mode, "-counter") {
		return proctest.CountUnder(ctx, locker)
	}
	return proctest.HoldUntilChecked(ctx, locker)
}
