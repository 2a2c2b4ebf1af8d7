// Package task runs long, multi-step agent tasks so that exactly one worker
// runs a task at a time, every completed step is checkpointed under a fence,
// and a task whose worker died resumes from the step after its last
// checkpoint on another worker.
//
// A task is an ordered list of [Step]s. Each step receives a context and the
// state the previous step returned, and returns the new state. A [Runner]:
//
//   - takes the task's lock (fenced, bound to the runner's lease), waiting on
//     a watch (not polling) while another worker has it;
//   - loads the last checkpoint and resumes from the step after it;
//   - passes each step a context that is cancelled the moment the lock is
//     lost, so an in-flight LLM call is aborted, not paid for twice;
//   - writes each checkpoint, with the step's record (step, name, worker,
//     fencing token, times), in one etcd transaction fenced by the lock's
//     token: a worker that lost its lock (paused, partitioned) can never
//     write, and a refused write stops its run at once; checkpoints are
//     data-plane writes, refused with drover.ErrStoreFull while etcd's
//     database is past the server's high-water mark (package storeguard);
//   - marks the task completed in the same transaction as the last
//     checkpoint, so a finished task never starts again.
//
// A step can end with a sleep: it returns its state with Sleep(d) or
// SleepUntil(t) as its error. The state is checkpointed with the time the
// sleep ends, the run stops and lets the task go (Run returns with
// Result.SleepingUntil set and the lock released), and no run goes on to
// the next step before that time. From a queue (queue.Steps) the task is
// parked on the queue's due index and any worker resumes it then.
//
// A step can end with a wait for a signal: it returns its state with
// WaitSignal(name, timeout) (or WaitSignals) as its error. The state is
// checkpointed with what the task waits for; the next step runs once a
// signal of that name has been sent to the task (queue.Client.Signal,
// POST /v1/tasks/{id}/signals/{name}, drover signal) or the timeout has
// passed, and reads which through ReceivedSignal. The signal is consumed
// in that step's checkpoint, fenced as every checkpoint: a step that
// fails gets the same signal on its next attempt, and a run that lost its
// lock or claim consumes nothing. From a queue the task is parked WAITING
// and a signal wakes it at once.
//
// A step of a queued task (queue.Steps) can spawn child tasks: it returns
// its state with Spawn(children, opts) as its error. The list is written
// with the step's checkpoint, fenced, before any child is submitted, so a
// step run again spawns nothing twice; the task then waits, parked, for
// all of its children or the first N, and the next step reads their
// outcomes with Children (or ChildrenPage).
//
// Checkpoint state is meant to be small metadata (1 MiB by default, at most
// [MaxStateLimit]): etcd holds it in every member's memory and log. Put large
// state (documents, transcripts, embeddings) in an object store or
// PostgreSQL, and checkpoint its URI and digest.
//
//	r, err := task.NewRunner(ctx, cli, task.RunnerConfig{WorkerID: "worker-1", TTL: 10 * time.Second})
//	if err != nil { ... }
//	defer r.Close(context.Background())
//	res, err := r.Run(ctx, "report-42", []task.Step{
//		{Name: "Data Ingestion", Run: ingest},
//		{Name: "LLM Analysis", Run: analyze},
//	})
//
// # On another lock backend
//
// With RunnerConfig.Locker set to a redislock.Locker, redislock.Redlock or
// paxoslock.Locker, the runner takes the task's lock ("task:ID") from that
// backend, waiting with Acquire, and runs the steps under the lock's
// context; checkpoints stay in etcd. The guarantees do not change, because the fence is the lock's
// token, checked in etcd: the key /{ns}/tasks/{id}/fence holds the highest
// token that wrote for the task, and each checkpoint (and the completion
// mark) is written in one transaction that commits only if that key is at
// most the writer's token, and raises it to the token. A new holder raises
// the key as soon as it holds the lock, before it loads the checkpoint, so
// from then on a paused or cut-off earlier holder's write is refused
// (lock.ErrFenced) and its run stops, even if the new holder has written
// nothing yet. The lock is released fenced by its token in its backend.
//
//	locker, err := paxoslock.New(paxoslock.Config{Endpoints: nodes, TTL: 10 * time.Second, HolderID: "worker-1"})
//	if err != nil { ... }
//	defer locker.Close(context.Background())
//	r, err := task.NewRunner(ctx, cli, task.RunnerConfig{WorkerID: "worker-1", Locker: locker})
//
// What differs is not safety: waiters poll the backend rather than watch
// etcd; the runner holds no etcd lease; every worker of a task must use the
// same backend (tokens of different backends are not comparable); and a
// backend's tokens must keep growing for a task (a Paxos group rebuilt with
// empty data restarts them: delete the task's fence key to start over). A
// queue worker's claim sees only etcd's task lock: the runner waits for a
// queue worker already running the id, but give no queued task the id of a
// task run on another backend.
package task
