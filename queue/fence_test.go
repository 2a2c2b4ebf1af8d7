package queue_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lease/fencetest"
	"github.com/droverhq/drover/queue"
)

// TestClaimIsAFence runs the fence conformance suite against a queue task's
// claim: each claim is a worker of its own (its own lease) whose handler
// hands over queue.ClaimFence and holds the task until released; a release
// fails the attempt, so the task is claimable again; a loss is the worker's
// lease revoked, which its watch of the queue's deletions notices at once.
func TestClaimIsAFence(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	var mu sync.Mutex
	workers := map[lease.Fence]*queue.Worker{}
	retries := queue.MaxMaxRetries
	fencetest.Exercise(t, fencetest.Harness{
		Client: cli,
		Key:    "/" + ns + "/fenced",
		Claim: func(ctx context.Context, id string) (lease.Fence, func(), error) {
			q := "fence-" + id
			if _, err := c.Submit(ctx, q, []queue.Task{{ID: q, Type: "hold", MaxRetries: &retries}}, nil); err != nil {
				return nil, nil, err
			}
			w, err := queue.NewWorker(ctx, srv.Client(t), queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1, TTL: 5 * time.Second,
				BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})
			if err != nil {
				return nil, nil, err
			}
			fences, released := make(chan lease.Fence), make(chan struct{})
			w.HandleAll(func(hctx context.Context, _ *queue.Task) ([]byte, error) {
				select {
				case fences <- queue.ClaimFence(hctx):
				case <-hctx.Done():
					return nil, hctx.Err()
				}
				select {
				case <-released:
				case <-hctx.Done():
				}
				return nil, errors.New("released") // back in the queue for the next holder
			})
			rctx, stop := context.WithCancel(context.Background())
			ran := make(chan struct{})
			go func() { _ = w.Run(rctx); close(ran) }()
			end := func() { stop(); <-ran; _ = w.Close(context.Background()) }
			select {
			case f := <-fences:
				mu.Lock()
				workers[f] = w
				mu.Unlock()
				var once sync.Once
				return f, func() { once.Do(func() { close(released); end() }) }, nil
			case <-ctx.Done():
				end()
				return nil, nil, ctx.Err()
			}
		},
		Lose: func(ctx context.Context, f lease.Fence) error {
			mu.Lock()
			w := workers[f]
			mu.Unlock()
			_, err := cli.Revoke(ctx, w.Lease().ID())
			return err
		},
		LossWithin: time.Second, // the lease's next renewal would take 1.7 s
	})
}
