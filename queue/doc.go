// Package queue is drover's durable task queue on etcd, for millions of
// offline agent tasks: batched submission that is idempotent on task id,
// batched claims bound to the worker's lease and fenced, retries with
// exponential backoff and full jitter, a dead-letter queue, and cancellation.
//
// A fresh task lives in a segment: one key holding up to 100 tasks of one
// queue and priority level, written once at submission, with one small
// index key per task that makes its id idempotent (see keyspace and
// docs/queue.md). A segment's state is a few keys beside it, not per task:
// it is open while it has unfinished tasks; a claim is a run, one key
// bound to the worker's lease naming the slots it took (with a durable
// twin, its try, that keeps the attempts when the worker dies); outcomes
// are one key per batch of a run; a slot that leaves the segment
// (cancelled, purged) has an exit key. Only a task that leaves the common
// path (a failed attempt, the dead-letter queue, a hand-back, a
// cancellation) gets a record of its own, moved there in the same fenced
// transaction that records the outcome, with the per-task keys: a pending
// key, a claim key bound to the lease while it runs, a retry key while it
// waits for its backoff (a sleep key while a step task sleeps: see
// Steps), dead and done keys once finished. Because claims
// are lease-bound, a worker that dies releases its tasks by itself when
// its lease expires: no reaper, no timeout to tune. Every write a worker
// makes about a task is fenced by its claim's create revision (a run's,
// or a claim key's), so a worker that lost a claim cannot write.
//
// The package's types: Client submits, reads and administers tasks, and
// brokers the claims and reports of workers outside the process (the HTTP
// API's); Worker runs handlers, with a claimer that picks the segments and
// tasks to claim. The stored values of runs and outcomes, and the rule
// that a task id has one holder at a time (a queue worker or a task
// runner of package task), are package internal/taskstore's.
//
//	c, _ := queue.NewClient(cli, "drover")
//	res, _ := c.Submit(ctx, "emails", []queue.Task{{Type: "summarize", Parameters: params}}, nil)
//	w, _ := queue.NewWorker(ctx, cli, queue.WorkerConfig{Queue: "emails", Concurrency: 16})
//	w.Handle("summarize", func(ctx context.Context, t *queue.Task) ([]byte, error) { ... })
//	err := w.Run(ctx)
package queue
