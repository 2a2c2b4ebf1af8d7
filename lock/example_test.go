package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Take a lock, write under its fencing token, and see a second worker
// refused until the lock is released.
func ExampleEtcd() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ns := fmt.Sprintf("example-etcd-%d", time.Now().UnixNano()) // a namespace of its own

	worker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 10 * time.Second, HolderID: "worker-a"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer worker.Close(ctx)
	l, err := worker.AcquireFenced(ctx, "report-42") // an *EtcdLock: a lease.Fence
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("token > 0:", l.Token() > 0)

	// The write commits only while the lock is held with this token.
	key := "/" + ns + "/reports/42"
	resp, err := l.Txn(ctx).Then(clientv3.OpPut(key, "written by worker-a")).Commit()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("fenced write applied:", resp.Succeeded)

	other, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 10 * time.Second, HolderID: "worker-b"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer other.Close(ctx)
	_, err = other.TryAcquire(ctx, "report-42")
	fmt.Println("worker-b refused, lock held:", errors.Is(err, lock.ErrHeld))
	var held *lock.HeldError
	if errors.As(err, &held) {
		fmt.Println("held by:", held.Holder.ID, "with the same token:", held.Token == l.Token())
	}

	if err := l.Release(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("after release:", context.Cause(l.Context()))
	next, err := other.TryAcquire(ctx, "report-42")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer next.Release(ctx)
	fmt.Println("worker-b took it with a later token:", next.Token() > l.Token())
	// Output:
	// token > 0: true
	// fenced write applied: true
	// worker-b refused, lock held: true
	// held by: worker-a with the same token: true
	// after release: lock: released
	// worker-b took it with a later token: true
}

// Lockers of one process that share a Batcher send the acquisitions and
// releases they make at the same time in fewer etcd requests; each keeps
// its own answer.
func ExampleBatcher() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ns := fmt.Sprintf("example-batcher-%d", time.Now().UnixNano())
	b := lock.NewBatcher(cli)
	results := make(chan string, 2)
	for _, name := range []string{"a", "b"} {
		go func() {
			locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 10 * time.Second, Batcher: b})
			if err != nil {
				results <- err.Error()
				return
			}
			l, err := locker.TryAcquireFenced(ctx, name)
			msg := ""
			if err != nil {
				msg = err.Error()
			} else {
				msg = fmt.Sprintf("held %s: %t", name, l.Token() > 0)
				_ = l.Release(ctx)
			}
			_ = locker.Close(ctx)
			results <- msg
		}()
	}
	got := []string{<-results, <-results}
	if got[0] > got[1] {
		got[0], got[1] = got[1], got[0]
	}
	fmt.Println(got[0])
	fmt.Println(got[1])
	// Output:
	// held a: true
	// held b: true
}
