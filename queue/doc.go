// Package queue is drover's durable task queue on etcd, for millions of
// offline agent tasks: batched submission that is idempotent on task id,
// batched claims bound to the worker's lease and fenced, retries with
// exponential backoff and full jitter, a dead-letter queue, and cancellation.
//
// A task's state is where its keys are (see keyspace): a pending key exists
// until the task finishes; a claim key, bound to the claiming worker's lease,
// marks it running; a retry key schedules it after a failure; dead and done
// keys hold finished tasks. Because a claim is lease-bound, a worker that dies
// releases its tasks by itself when its lease expires: no reaper, no timeout
// to tune. Every write a worker makes about a task is fenced by its claim's
// create revision, so a worker that lost a claim cannot write.
//
//	c, _ := queue.NewClient(cli, "drover")
//	res, _ := c.Submit(ctx, "emails", []queue.Task{{Type: "summarize", Parameters: params}}, nil)
//	w, _ := queue.NewWorker(ctx, cli, queue.WorkerConfig{Queue: "emails", Concurrency: 16})
//	w.Handle("summarize", func(ctx context.Context, t *queue.Task) ([]byte, error) { ... })
//	err := w.Run(ctx)
package queue
