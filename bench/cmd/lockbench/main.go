// Command lockbench compares lock cycles per second (acquire + release) of
// drover's Redis lock backend, fencing token included, with
// go-redsync/redsync on the same Redis: 64 goroutines on distinct keys. It
// prints one JSON line per system and the ratio.
package main

import (
	"github.com/droverhq/drover/lock/redislock"

	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "Redis address (loopback only)")
	workers := flag.Int("goroutines", 64, "goroutines, one key each")
	dur := flag.Duration("duration", 5*time.Second, "how long each system runs")
	flag.Parse()
	rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: *workers * 2})
	defer rdb.Close()
	ctx := context.Background()
	locker, err := redislock.New(rdb, redislock.Config{Namespace: "lockbench", TTL: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rs := redsync.New(goredis.NewPool(rdb))
	run := func(name string, cycle func(key string) error) float64 {
		var n atomic.Int64
		var wg sync.WaitGroup
		stop := time.Now().Add(*dur)
		for g := 0; g < *workers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("k%d", g)
				for time.Now().Before(stop) {
					if err := cycle(key); err != nil {
						fmt.Fprintln(os.Stderr, name, err)
						return
					}
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		rate := float64(n.Load()) / dur.Seconds()
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"system": name, "cycles_per_s": rate})
		return rate
	}
	d := run("drover-redis", func(key string) error {
		l, err := locker.TryAcquire(ctx, key)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})
	r := run("redsync", func(key string) error {
		m := rs.NewMutex("redsync:"+key, redsync.WithExpiry(10*time.Second), redsync.WithTries(1))
		if err := m.LockContext(ctx); err != nil {
			return err
		}
		_, err := m.UnlockContext(ctx)
		return err
	})
	fmt.Printf("drover / redsync: %.2fx\n", d/r)
}
