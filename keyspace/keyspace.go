// Package keyspace is the one place where drover's etcd keys are built.
//
// Every key drover writes lives under a namespace, "/{ns}/", so that several
// drover installations can share one etcd cluster. The layout is:
//
//	/{ns}/locks/{name}/{contender}   lock contenders; the oldest is the holder ({contender}: "{lease:016x}-{random}-{slot}")
//	/{ns}/locks/task:{id}/...         the lock a queued task's run holds ([TaskLock])
//	/{ns}/locks/thread:{thread}/...   the lock a checkpoint thread's admitted run holds ([ThreadLock])
//	/{ns}/tasks/{id}/checkpoint       a task's latest checkpoint
//	/{ns}/tasks/{id}/steps/{NNNNNN}   the record of each completed step
//	/{ns}/tasks/{id}/record           a queued task's record of its own (retrying, dead, cancelled, handed back)
//	/{ns}/tasks/{id}/fence            the highest fencing token a task's writes were made under, 20 digits, when its runner takes its lock from another backend than etcd
//	/{ns}/tasks/{id}/stream/{first}-{last} a chunk of a task's stream: events first..last (12 digits each), written by one attempt at once (stream.go)
//	/{ns}/stream-expiry/{due}-{id}    when task id's stream may be removed (19-digit Unix nanoseconds)
//	/{ns}/tasks/{id}/children/plan/{step}/{chunk} the children step {step} spawned, in chunks (children.go; step and chunk 6 digits)
//	/{ns}/tasks/{id}/children/submitted/{step} every child of the step's plan was submitted
//	/{ns}/tasks/{id}/children/done/{step}/{child} a child's terminal outcome
//	/{ns}/tasks/{id}/children/failed/{step}/{child} a child that ended DEAD or CANCELLED
//	/{ns}/tasks/{id}/signals/in/{name}/{idem} a signal sent to a step task and not yet consumed (signals.go; {idem}: its idempotency key)
//	/{ns}/tasks/{id}/signals/seen/{name}/{idem} a consumed signal's tombstone: a retried send is not delivered twice
//	/{ns}/child-wakes/{q}/{id}        a child of task id (of queue q) ended: its wait may be over (children.go)
//	/{ns}/child-cascades/{q}/{id}     task id (of queue q) ended CANCELLED or DEAD: its live children are to be cancelled (children.go)
//	/{ns}/ids/{id}                    a queued task's index key: "{queue}/{segment}/{slot}"; makes task_id idempotent
//	/{ns}/segments/{q}/{segment}      up to 100 tasks of queue q as submitted, in one key
//	/{ns}/queues/{q}/open/{segment}   a segment with unfinished tasks; value: its number of tasks
//	/{ns}/queues/{q}/due/{due}-{segment}-{n} a segment of n tasks that runs later; it moves to open/ when due (internal/due)
//	/{ns}/queues/{q}/duever           put or deleted by every change of the due index: its mod revision says whether the index changed
//	/{ns}/queues/{q}/closed/{closed}-{segment} a finished segment; value: how many succeeded in it
//	/{ns}/queues/{q}/runs/{segment}/{n}-{run} a claim of n slots of a segment, bound to the worker's lease
//	/{ns}/queues/{q}/tries/{segment}/{n}-{run} a run's durable twin: the attempts it started
//	/{ns}/queues/{q}/outs/{segment}/{token}-{ok}-{moved}-{seq} a batch of a run's outcomes
//	/{ns}/queues/{q}/exits/{segment}/{slot}[-ok] a slot that left its segment (cancelled, purged)
//	/{ns}/queues/{q}/pending/{shard}/{level}{submitted}-{id} a task with a record of its own that waits to run
//	/{ns}/queues/{q}/claims/{id}      the claim of a running task, bound to its worker's lease
//	/{ns}/queues/{q}/retry/{due}-{id} a task waiting for its backoff (times: 19-digit Unix nanoseconds)
//	/{ns}/queues/{q}/sleep/{due}-{id} a step task parked until its sleep ends
//	/{ns}/queues/{q}/wait/{due}-{id}  a step task waiting for a signal, due at the wait's timeout (signals.go; value: where it goes back to)
//	/{ns}/queues/{q}/dead/{id}        a task in the dead-letter queue
//	/{ns}/queues/{q}/done/{status}/{finished}-{id} a task that SUCCEEDED or was CANCELLED
//	/{ns}/queues/{q}/archived         counts of finished tasks removed after their retention
//	/{ns}/queues/{q}/config           the queue's settings (maximum depth)
//	/{ns}/queues/{q}/paused           the queue is paused: while it exists no claim of its tasks commits (value: when and by whom)
//	/{ns}/queues/{q}/levels/{level}   a priority level that may have pending tasks
//	/{ns}/queue-names/{q}             the queue directory: a queue that was submitted to or configured
//	/{ns}/queue-history/q/{q}/{minute} queue q's counts of one minute (processed, failed, retried, deferred, depth, latency); leased for a day
//	/{ns}/queue-history/mark          the last minute of queue history closed, and the revision its counts go through
//	/{ns}/checkpoints/{thread}/{cpns|@}/{head|fence|cp/{id}|writes/{id}} agent state per thread ({cpns}: the checkpoint namespace as it is when it is a name, else "~" and its base64url)
//	/{ns}/checkpoints/{thread}/interrupt a request that the thread's current run stop for a newer one (its value: when it was made)
//	/{ns}/queues/{q}/cancel/{id}      a request to cancel a running task
//	/{ns}/components/{component}/endpoints/{id} a registered endpoint, bound to its process's primary lease
//	/{ns}/limits/{name}/{config|state} a fleet-wide rate limit: its rate, and its token bucket
//	/{ns}/quotas/{name}/config        a concurrency quota's limit
//	/{ns}/breakers/{name}/{config|state} a circuit breaker: its thresholds, and its state
//	/{ns}/quotas/{name}/grants/{subject}/{lease:hex} slots a worker holds, bound to its lease
//	/{ns}/quotas/{name}/ledger/{subject} rewritten by every grant increase (compare-and-swap)
//	/{ns}/budgets/{config|state}/{key} an LLM budget's limits and shares, and its window's counters ({key} path-escaped)
//	/{ns}/budgets/res/{key}/{id}      one reservation of a budget, bound to its holder's lease
//	/{ns}/sessions/{id}               an HTTP client's session: bound to the etcd lease it stands for (id: the lease, hex)
//	/{ns}/schedules/specs/{name}      a schedule: its spec and the state its fires keep
//	/{ns}/schedules/due/{due:019d}-{name} a schedule's next fire, in the due index (internal/due)
//	/{ns}/schedules/history/{name}/{slot:04d} one fire of a schedule, in a ring of slots
//	/~drover/schedule-namespaces/{ns} a namespace that has schedules: every server fires them (the one key outside a namespace)
//	/{ns}/store/full                  the store-full guard: while it exists, data-plane writes (submissions, checkpoints) are refused
//
// Names that become one path segment are checked by [CheckName], so that no
// name can reach into another name's keys. The keys that carry more than a
// name (a lock contender's lease; a pending task's shard, level and
// submission time; a retry's due time; a quota grant's subject and lease; a
// checkpoint's parts) are built and parsed here too ([ContenderPrefix] and
// [ContenderLease], [Space.PendingKey] and [ParsePending], [TimedKey] and
// [ParseTimedKey], [SplitName], ...), with round-trip tests: no other package
// builds or slices a key. (The Redis lock's keys are Redis's, named in
// package lock next to the scripts that use them.)
package keyspace

import (
	"fmt"
	"strings"

	"github.com/droverhq/drover"
)

// DefaultNamespace is the namespace used when none is given.
const DefaultNamespace = "drover"

// MaxNameLen is the longest name allowed for a namespace, lock or other
// single key segment.
const MaxNameLen = 128

// NameRule describes the names that [CheckName] accepts.
const NameRule = "must be 1 to 128 characters of letters, digits, '.', '_', '-' or ':', and not '.' or '..'"

// CheckName returns a [drover.InputError] naming field unless name is a valid
// single key segment.
func CheckName(field, name string) error {
	if !validName(name) {
		return &drover.InputError{Field: field, Value: name, Rule: NameRule}
	}
	return nil
}

func validName(name string) bool {
	if len(name) == 0 || len(name) > MaxNameLen || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == '-', c == ':':
		default:
			return false
		}
	}
	return true
}

// Space builds the keys of one namespace. The zero value is not valid; use
// [New].
type Space struct {
	root string
}

// New returns the key space of namespace ns ("" means [DefaultNamespace]).
func New(ns string) (Space, error) {
	if ns == "" {
		ns = DefaultNamespace
	}
	if err := CheckName("namespace", ns); err != nil {
		return Space{}, err
	}
	return Space{root: "/" + ns + "/"}, nil
}

// MustNew is New for namespaces known to be valid; it panics otherwise.
func MustNew(ns string) Space {
	s, err := New(ns)
	if err != nil {
		panic(err)
	}
	return s
}

// Root is the prefix of every key in the namespace, ending in "/".
func (s Space) Root() string { return s.root }

// Locks is the prefix of every lock key, ending in "/".
func (s Space) Locks() string { return s.root + "locks/" }

// Lock is the prefix under which the contenders for lock name live, ending
// in "/". The contender with the lowest create revision holds the lock.
func (s Space) Lock(name string) string { return s.Locks() + name + "/" }

// LockContender is the key of one contender for lock name.
func (s Space) LockContender(name, contender string) string { return s.Lock(name) + contender }

// LockName returns the lock name of a key under [Space.Locks], and false when
// key is not a contender key of this namespace.
func (s Space) LockName(key string) (string, bool) {
	name, _, ok := s.ParseLockContender(key)
	return name, ok
}

// String returns the namespace root, for logs.
func (s Space) String() string { return fmt.Sprintf("keyspace(%s)", s.root) }

// Tasks is the prefix of every task's keys, ending in "/".
func (s Space) Tasks() string { return s.root + "tasks/" }

// Task is the prefix of task id's keys, ending in "/".
func (s Space) Task(id string) string { return s.Tasks() + id + "/" }

// TaskCheckpoint is the key of task id's latest checkpoint.
func (s Space) TaskCheckpoint(id string) string { return s.Task(id) + "checkpoint" }

// TaskSteps is the prefix of task id's step records, ending in "/".
func (s Space) TaskSteps(id string) string { return s.Task(id) + "steps/" }

// TaskStep is the key of the record of step n (1-based) of task id. Step
// numbers are zero-padded so that keys sort in step order.
func (s Space) TaskStep(id string, n int) string { return fmt.Sprintf("%s%06d", s.TaskSteps(id), n) }

// TaskFence is the key holding the highest fencing token task id's
// checkpoints were written under, when its runner holds the task through a
// lock of another backend than etcd (package task).
func (s Space) TaskFence(id string) string { return s.Task(id) + "fence" }

// TaskTrace is the key of the W3C traceparent kept with agent task id:
// its creation context, stored by its first claim that gives one.
func (s Space) TaskTrace(id string) string { return s.Task(id) + "traceparent" }

// TaskLock is the lock name that guards task id's runner.
func TaskLock(id string) string { return "task:" + id }

// ThreadLock is the lock name that a run on checkpoint thread thread holds
// (package checkpoint's admission).
func ThreadLock(thread string) string { return "thread:" + thread }

// TaskRecord is the key of queued task id's record.
func (s Space) TaskRecord(id string) string { return s.Task(id) + "record" }

// Queue is the prefix of queue q's keys, ending in "/".
func (s Space) Queue(q string) string { return s.root + "queues/" + q + "/" }

// QueueNames is the prefix of the queue directory: one key per queue that
// was ever submitted to or configured, so that queues can be listed without
// reading their tasks' keys.
func (s Space) QueueNames() string { return s.root + "queue-names/" }

// QueueName is queue q's key in the queue directory.
func (s Space) QueueName(q string) string { return s.QueueNames() + q }

// QueuePending is the prefix of queue q's pending index, ending in "/".
func (s Space) QueuePending(q string) string { return s.Queue(q) + "pending/" }

// QueueClaims is the prefix of queue q's claims, ending in "/".
func (s Space) QueueClaims(q string) string { return s.Queue(q) + "claims/" }

// QueueClaim is the claim key of task id in queue q.
func (s Space) QueueClaim(q, id string) string { return s.QueueClaims(q) + id }

// QueueRetry is the prefix of queue q's retry schedule, ending in "/".
func (s Space) QueueRetry(q string) string { return s.Queue(q) + "retry/" }

// QueueSleep is the prefix of queue q's sleeping tasks, ending in "/":
// keys "{due}-{id}", as the retry schedule's.
func (s Space) QueueSleep(q string) string { return s.Queue(q) + "sleep/" }

// QueueDead is the prefix of queue q's dead-letter queue, ending in "/".
func (s Space) QueueDead(q string) string { return s.Queue(q) + "dead/" }

// QueueDone is the prefix of queue q's finished tasks with status st, ending
// in "/".
func (s Space) QueueDone(q, st string) string { return s.Queue(q) + "done/" + st + "/" }

// QueueCancel is the prefix of queue q's cancel requests, ending in "/".
func (s Space) QueueCancel(q string) string { return s.Queue(q) + "cancel/" }

// DeadTask is the key of task id in queue q's dead-letter queue.
func (s Space) DeadTask(q, id string) string { return s.QueueDead(q) + id }

// CancelTask is the key of the request to cancel task id of queue q.
func (s Space) CancelTask(q, id string) string { return s.QueueCancel(q) + id }

// QueueArchived is the key of queue q's counts of finished tasks that were
// removed after their retention period.
func (s Space) QueueArchived(q string) string { return s.Queue(q) + "archived" }

// Checkpoints is the prefix of thread's checkpoints, ending in "/".
func (s Space) Checkpoints(thread string) string { return s.root + "checkpoints/" + thread + "/" }

// Components is the prefix of every registered endpoint, ending in "/".
func (s Space) Components() string { return s.root + "components/" }

// ComponentEndpoints is the prefix of component's endpoints, ending in "/".
func (s Space) ComponentEndpoints(component string) string {
	return s.Components() + component + "/endpoints/"
}

// Endpoint is the key of endpoint id of component.
func (s Space) Endpoint(component, id string) string { return s.ComponentEndpoints(component) + id }

// EndpointOf returns the component and endpoint id of a key under
// Space.Components, and false when key is not an endpoint key of this
// namespace.
func (s Space) EndpointOf(key string) (component, id string, ok bool) {
	rest, ok := strings.CutPrefix(key, s.Components())
	if !ok {
		return "", "", false
	}
	component, rest, ok = strings.Cut(rest, "/")
	if !ok || component == "" {
		return "", "", false
	}
	id, ok = strings.CutPrefix(rest, "endpoints/")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	return component, id, true
}

// Namespace returns the namespace's name.
func (s Space) Namespace() string { return strings.Trim(s.root, "/") }

// Limits is the prefix of every rate limit, ending in "/".
func (s Space) Limits() string { return s.root + "limits/" }

// LimitConfig is the key of rate limit name's configuration.
func (s Space) LimitConfig(name string) string { return s.Limit(name) + ConfigPart }

// LimitState is the key of rate limit name's token bucket.
func (s Space) LimitState(name string) string { return s.Limit(name) + StatePart }

// Quotas is the prefix of every concurrency quota, ending in "/".
func (s Space) Quotas() string { return s.root + "quotas/" }

// QuotaConfig is the key of quota name's configuration.
func (s Space) QuotaConfig(name string) string { return s.Quota(name) + ConfigPart }

// QuotaGrants is the prefix of quota name's grants for subject (a tenant, a
// task type, or "-" for a named resource), ending in "/"; subject "" gives
// the prefix of all its grants. A grant is the number of slots one worker
// holds, bound to its lease.
func (s Space) QuotaGrants(name, subject string) string {
	if subject == "" {
		return s.Quotas() + name + "/grants/"
	}
	return s.Quotas() + name + "/grants/" + subject + "/"
}

// QuotaLedger is the key every grant increase of quota name for subject
// rewrites, so that two increases cannot both succeed on the same reading.
func (s Space) QuotaLedger(name, subject string) string {
	return s.Quotas() + name + "/ledger/" + subject
}

// Breakers is the prefix of every circuit breaker, ending in "/".
func (s Space) Breakers() string { return s.root + "breakers/" }

// BreakerConfig is the key of breaker name's thresholds.
func (s Space) BreakerConfig(name string) string { return s.Breaker(name) + ConfigPart }

// BreakerState is the key of breaker name's state.
func (s Space) BreakerState(name string) string { return s.Breaker(name) + StatePart }

// QueueConfig is the key of queue q's settings.
func (s Space) QueueConfig(q string) string { return s.Queue(q) + "config" }

// QueuePaused is the key that pauses queue q: every claim transaction
// compares its absence.
func (s Space) QueuePaused(q string) string { return s.Queue(q) + "paused" }

// QueueLevels is the prefix of queue q's priority level markers, ending in
// "/".
func (s Space) QueueLevels(q string) string { return s.Queue(q) + "levels/" }

// StoreFull is the key of the store-full guard: the server writes it (its
// value says how full etcd's database is) while usage is past the
// high-water mark, and data-plane writers compare its absence in their
// transactions (package storeguard).
func (s Space) StoreFull() string { return s.root + "store/full" }

// Sessions is the prefix of the HTTP API's sessions, ending in "/".
func (s Space) Sessions() string { return s.root + "sessions/" }

// Session is the key of session id (its etcd lease, in hex), bound to that
// lease: it exists exactly as long as the session does.
func (s Space) Session(id string) string { return s.Sessions() + id }
