package paxos

// Op names what a Command does.
type Op string

// Operations. The lock operations are applied by the lock table; noop and
// the membership changes by the node itself.
const (
	// OpNoop fills a slot a new leader found empty.
	OpNoop Op = "noop"
	// OpAcquire takes Lock for Owner for TTL, if free (or expired, and
	// past the command's LockDelay) at Time.
	OpAcquire Op = "acquire"
	// OpRelease frees Lock if Owner holds it with Token.
	OpRelease Op = "release"
	// OpRenew extends Lock by TTL from Time if Owner holds it with Token.
	OpRenew Op = "renew"
	// OpGet reads Lock: reads go through the log, so they are
	// linearizable.
	OpGet Op = "get"
	// OpList reads every held lock.
	OpList Op = "list"
	// OpTick expires every lock whose time is up at Time. The leader
	// proposes it when the earliest expiry has passed.
	OpTick Op = "tick"
	// OpAddNode adds Node (at Addr) to the group.
	OpAddNode Op = "add_node"
	// OpRemoveNode removes Node from the group.
	OpRemoveNode Op = "remove_node"
)

// Command is one value of the replicated log. The leader assigns Time
// and LockDelay when it proposes the command; the state machine judges
// expiry and lock-delay against them, never against a local clock or a
// node's own settings, so every node applies the log to the same table.
type Command struct {
	Op Op `json:"op"`
	// ID identifies the request, so a command forwarded twice is applied
	// once (the second gets the first's result).
	ID string `json:"id,omitempty"`
	// Time is the leader's clock when it proposed the command, in Unix
	// milliseconds, never below any earlier command's Time.
	Time int64 `json:"time,omitempty"`
	// LockDelay is the proposing leader's lock-delay (Config.LockDelay)
	// in milliseconds: an acquire or tick judges the lock-delay of an
	// expired lock by it. The leader overwrites what a caller set.
	LockDelay int64  `json:"lock_delay,omitempty"`
	Lock      string `json:"lock,omitempty"`
	Owner     string `json:"owner,omitempty"`
	// TTL is the lease length in milliseconds.
	TTL int64 `json:"ttl,omitempty"`
	// Token is the fencing token a release or renewal names.
	Token uint64 `json:"token,omitempty"`
	// Node and Addr name the member a membership change adds or removes.
	Node NodeID `json:"node,omitempty"`
	Addr string `json:"addr,omitempty"`
	// Meta is opaque data stored with a grant (a holder's description).
	Meta string `json:"meta,omitempty"`
}

// Code is the outcome of applying a command.
type Code string

// Outcomes.
const (
	CodeOK Code = "ok"
	// CodeHeld: the lock is held by someone else (acquire).
	CodeHeld Code = "held"
	// CodeNotHeld: the owner and token do not hold the lock (release,
	// renew).
	CodeNotHeld Code = "not_held"
	// CodeNotFound: the lock is free (get).
	CodeNotFound Code = "not_found"
	// CodeRejected: a membership change broke a rule (Err says which).
	CodeRejected Code = "rejected"
	// CodeReusedID: the command's ID was applied before for a different
	// request (another op, lock, owner, token, ttl, holder or member);
	// nothing was applied, and Err says so. Index is the slot the ID was
	// first applied at.
	CodeReusedID Code = "reused_id"
)

// LockState is one held lock.
type LockState struct {
	Name  string `json:"lockId"`
	Owner string `json:"owner"`
	// Token is the log index of the grant: it only grows.
	Token uint64 `json:"token"`
	// Acquired and Expires are leader times in Unix milliseconds.
	Acquired int64  `json:"acquired"`
	Expires  int64  `json:"expires"`
	Meta     string `json:"meta,omitempty"`
}

// Result is what applying a command answered.
type Result struct {
	Code Code `json:"code"`
	// Lock is the lock after the command (the holder when CodeHeld).
	Lock LockState `json:"lock"`
	// Locks answers OpList.
	Locks []LockState `json:"locks,omitempty"`
	// Err explains CodeRejected and CodeReusedID.
	Err string `json:"err,omitempty"`
	// Index is the slot the command was applied at.
	Index uint64 `json:"index"`
}

// StateMachine is what the log is applied to, in slot order, on every
// node. Apply must be deterministic: the same commands give the same
// results and state everywhere.
type StateMachine interface {
	// Apply applies cmd, chosen at slot index.
	Apply(index uint64, cmd Command) Result
	// NextExpiry is the earliest time (Unix ms) at which a tick would
	// change something, or 0 when nothing will expire.
	NextExpiry() int64
	// Now is the latest command Time applied: a new leader never assigns
	// a Time below it.
	Now() int64
	// Snapshot serializes the state.
	Snapshot() ([]byte, error)
	// Restore replaces the state with a snapshot's.
	Restore(data []byte) error
}
