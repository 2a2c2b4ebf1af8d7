// Package chaos proves drover's guarantees under faults, with real processes
// and real crashes. It holds tests only; nothing imports it.
//
// The tests start `drover server` (the embedded etcd) as subprocesses,
// built once from ./cmd/drover (or $DROVER_BIN), and two small programs
// built the same way without the race detector: internal/chaosworker, a
// queue.Worker that logs every attempt it runs, and internal/lockclient, a
// lock client that prints every operation it makes with its times. Faults
// are signals sent to those processes: SIGKILL of workers, lock clients and
// servers, and SIGSTOP past the lease TTL followed by SIGCONT. Everything
// listens on loopback only, every loop is bounded by a deadline, and server
// data lives on tmpfs when the machine has one (a killed process loses
// nothing the page cache holds).
//
//   - TestQueueChaos submits tasks with `drover submit` to a queue worked by
//     three workers while workers are killed every 2 s, one is paused past
//     its TTL, and the server is killed and restarted on its data dir. It
//     checks, from what etcd stored and what the workers logged, that every
//     task ends in exactly one terminal state and `drover tasks stats` sums
//     to the tasks submitted, that no task is acknowledged twice, that the
//     success stored is the task's last attempt's, that a paused worker's
//     late acknowledgements are refused, and that every task run more than
//     once was running in a worker a fault hit. It measures how long the
//     tasks of a worker hit by each kind of fault take to start again.
//   - TestLockLinearizableEtcd and TestLockLinearizableRedis record
//     histories of acquire, fenced write and release from eight client
//     processes on three lock names, while a holder is paused past its TTL,
//     another is killed, and the server restarts under a held lock; they
//     check them with porcupine against lockModel: one holder at a time (a
//     lock may end early only once its holder was paused, killed, or told
//     it lost the lock), tokens strictly increasing per name, and a fenced
//     write accepted only from the current holder. TestLockModelCatchesViolations
//     shows the check fails on histories that break each rule.
//   - TestQueueChaosThreeMembers and TestLockLinearizableEtcdThreeMembers
//     run the same on a three-member cluster and kill its leader.
//   - TestLeaderFailover runs everything at once on a three-member cluster,
//     in CI too, and SIGKILLs the etcd leader once (restarting it on its
//     data dir TTL + 0.5 s later): the queue worked by three worker
//     processes, lock client processes on a few lock names (four on two;
//     long: six on three), a registrar changing endpoints every 10 ms under
//     two registry watchers (one whose watch stream began on the leader,
//     one on a follower), and a write probe; every client knows all three
//     endpoints. It checks the queue as above, the lock history with
//     porcupine against lockModel, that each watcher delivered exactly
//     etcd's history of the endpoints, which is the registrar's requests
//     with every acknowledged one in it, and ended with the store's view;
//     it holds the first write after the kill to 3 s and reports when the
//     queue, the locks and the registry worked again.
//   - TestWorkflowChaos runs workflows (parents that spawn children, wait
//     for all, then wait for a signal) on three chaos/internal/wfworker
//     processes under worker SIGKILLs every 2 s, a pause past the TTL and
//     a server kill, and counts every child's and step's runs across the
//     processes: each once, except a run whose outcome was never stored,
//     which a fault ended before a run of a higher attempt started; the
//     outcome stored is the last run's. TestWorkflowCrashPoints hits the
//     parents' worker with SIGKILL (and, long, SIGSTOP) at each point of
//     a workflow (right after spawning, waiting for children, as the last
//     child completes, waiting for the signal, as it arrives).
//     TestWorkflowChildrenClaimedPromptly
//     reproduces children left PENDING 30 s after a takeover's spawn.
//   - TestStreamSurvivesServerRestart and TestStreamSurvivesLeaderFailover
//     follow a task's stream over SSE, reconnecting with Last-Event-ID,
//     while the server restarts or the leader of three members (the one
//     the follower reads from) is killed. TestStreamFencesPausedEmitter
//     pauses the emitter past its TTL so that another takes the task
//     over, then continues it: no event of the old attempt may follow the
//     new one's attempt_started, and its late writes must be fenced.
//   - TestQueuePausedWorkerStartsNoTask, TestEtcdLockNoFalseLossOnCluster
//     and TestRedisLockDeadlineCountsFromReply reproduce bugs these tests
//     found, now fixed; the first two run with DROVER_CHAOS=long.
//
// The default versions are sized for CI. DROVER_CHAOS=long runs the long
// versions, the three-member variants, and Redis with appendfsync always;
// DROVER_CHAOS_REPORT=FILE appends each run's figures to FILE as JSON lines
// (docs/reliability.md reports them):
//
//	go test -race ./chaos/
//	DROVER_CHAOS=long DROVER_CHAOS_REPORT=chaos.jsonl go test -race -v -timeout 50m ./chaos/
package chaos
