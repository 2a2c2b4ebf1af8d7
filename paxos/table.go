package paxos

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// DedupeWindow is how long, in command Time, the table remembers a
// command ID: the same request applied again within it gets the first
// result (a different request with that ID gets CodeReusedID).
const DedupeWindow = 5 * time.Minute

// tableSnapFormat is the version of the snapshot layout: 3 is binary (see
// tablesnap.go); 2 was JSON with the remembered results compact (see
// tableSeen), 1 JSON with them whole. Restore reads all three.
const tableSnapFormat = 3

// Table is the replicated lock table: the StateMachine every node applies
// the chosen log to. It is deterministic: it reads no clock and no setting
// of its own (expiry is judged against each command's Time, lock-delay
// against its LockDelay, both assigned by the leader), and no map order
// leaks into a result or a snapshot. A grant's fencing token is the slot
// it was chosen at, so tokens only grow.
//
// An expired lock stays in the table until an OpTick removes it, but it
// is no longer held: get, list, renew and release treat it as free. A
// lock that expired (not one that was released) cannot be granted again
// until its expiry plus the lock-delay the acquire (or the tick that
// removes it) carries.
//
// Methods are safe for concurrent use; the node's run loop is expected to
// be the only caller of Apply and Restore.
type Table struct {
	mu  sync.Mutex
	now int64
	// locks are the grants, expired ones included until a tick.
	locks map[string]LockState
	// delays are expired holders whose lock-delay runs: Expires is the
	// time the delay ends.
	delays map[string]LockState
	// seen are the results of the commands applied in the dedupe window,
	// oldest first, by ID. A snapshot copies a view of seen on another
	// goroutine while Apply goes on (seenlog.go).
	seen seenLog
	// next caches NextExpiry when nextOK; nextHas is false when nothing
	// will expire.
	next    int64
	nextHas bool
	nextOK  bool
}

// tableSnapshot is the serialized table: slices in a fixed order so two
// equal tables give equal bytes.
type tableSnapshot struct {
	Format int         `json:"format"`
	Now    int64       `json:"now"`
	Locks  []LockState `json:"locks"`  // by name
	Delays []LockState `json:"delays"` // by name
	Seen   []tableSeen `json:"seen"`   // oldest first
	// seenRaw, when set, stands for Seen: a view of the table's
	// remembered results, already encoded as format 3 holds them.
	seenRaw *seenView
}

var _ StateMachine = (*Table)(nil)

// NewTable returns an empty table. lockDelay is not used: the lock-delay
// is each command's LockDelay, which the leader stamps, so that nodes
// started with different settings still apply the log alike. The
// parameter stays for the callers written when it was the table's.
func NewTable(lockDelay time.Duration) *Table {
	_ = lockDelay
	return &Table{
		locks:  map[string]LockState{},
		delays: map[string]LockState{},
	}
}

// Apply applies cmd, chosen at slot index, at the command's Time (or at
// Now, if cmd.Time is below it, so time never runs backwards). A command
// whose ID was applied within DedupeWindow is not applied again: the same
// request gets the first result, Index included; a different request
// (another op, lock, owner, token, ttl, holder or member: see
// tableFingerprint) gets CodeReusedID. Reads (get, list) are not
// remembered: answering one again is as correct as the first answer. An
// unknown Op is answered CodeRejected and changes nothing.
func (t *Table) Apply(index uint64, cmd Command) Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := max(t.now, cmd.Time)
	t.now = now
	t.prune(now)
	remember := cmd.ID != "" && cmd.Op != OpGet && cmd.Op != OpList
	fp := tableFingerprint(cmd)
	if remember {
		if s, ok := t.seen.find(cmd.ID); ok {
			if s.FP != 0 && s.FP != fp {
				return Result{Code: CodeReusedID, Index: s.Index,
					Err: fmt.Sprintf("command id %q was used for a different request, applied at slot %d", cmd.ID, s.Index)}
			}
			return s.result(cmd)
		}
	}
	r := t.apply(index, now, cmd)
	r.Index = index
	if remember {
		t.seen.push(tableRemember(cmd, fp, now, r))
	}
	return r
}

// rememberResult replaces the result remembered for id, if any: the node
// decides a membership change's result, which a repeat of the change must
// get. Every node does so at the same slot, so tables stay equal.
func (t *Table) rememberResult(id string, res Result) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.seen.find(id); ok {
		t.seen.replace(tableRememberAll(id, s.FP, s.Time, res))
	}
}

// apply dispatches cmd.
func (t *Table) apply(index uint64, now int64, cmd Command) Result {
	switch cmd.Op {
	case OpAcquire:
		return t.acquire(index, now, cmd)
	case OpRelease:
		return t.release(now, cmd)
	case OpRenew:
		return t.renew(now, cmd)
	case OpGet:
		if h, ok := t.held(cmd.Lock, now); ok {
			return Result{Code: CodeOK, Lock: h}
		}
		return Result{Code: CodeNotFound, Lock: LockState{Name: cmd.Lock}}
	case OpList:
		return Result{Code: CodeOK, Locks: t.list(now)}
	case OpTick:
		t.tick(now, max(cmd.LockDelay, 0))
		return Result{Code: CodeOK}
	case OpNoop, OpAddNode, OpRemoveNode:
		return Result{Code: CodeOK}
	default:
		return Result{Code: CodeRejected, Err: fmt.Sprintf("unknown op %q", cmd.Op)}
	}
}

// acquire grants cmd.Lock if it is free, or expired and past its
// lock-delay. Otherwise it answers CodeHeld with the holder; during a
// lock-delay, with the expired holder and Expires set to the delay's end.
func (t *Table) acquire(index uint64, now int64, cmd Command) Result {
	if h, ok := t.locks[cmd.Lock]; ok {
		if now < h.Expires {
			return Result{Code: CodeHeld, Lock: h}
		}
		if end := tableAddMillis(h.Expires, max(cmd.LockDelay, 0)); now < end {
			h.Expires = end
			return Result{Code: CodeHeld, Lock: h}
		}
	} else if d, ok := t.delays[cmd.Lock]; ok && now < d.Expires {
		return Result{Code: CodeHeld, Lock: d}
	}
	t.deleteDelay(cmd.Lock)
	ls := LockState{
		Name:     cmd.Lock,
		Owner:    cmd.Owner,
		Token:    index,
		Acquired: now,
		Expires:  tableAddMillis(now, cmd.TTL),
		Meta:     cmd.Meta,
	}
	t.setLock(ls)
	return Result{Code: CodeOK, Lock: ls}
}

// release frees cmd.Lock if cmd.Owner holds it with cmd.Token and it has
// not expired; a release starts no lock-delay.
func (t *Table) release(now int64, cmd Command) Result {
	h, ok := t.held(cmd.Lock, now)
	if !ok || h.Owner != cmd.Owner || h.Token != cmd.Token {
		return Result{Code: CodeNotHeld, Lock: t.current(cmd.Lock, now)}
	}
	t.deleteLock(cmd.Lock)
	return Result{Code: CodeOK, Lock: LockState{Name: cmd.Lock}}
}

// renew moves cmd.Lock's expiry to Time+TTL if cmd.Owner holds it with
// cmd.Token and it has not expired.
func (t *Table) renew(now int64, cmd Command) Result {
	h, ok := t.held(cmd.Lock, now)
	if !ok || h.Owner != cmd.Owner || h.Token != cmd.Token {
		return Result{Code: CodeNotHeld, Lock: t.current(cmd.Lock, now)}
	}
	h.Expires = tableAddMillis(now, cmd.TTL)
	t.setLock(h)
	return Result{Code: CodeOK, Lock: h}
}

// held returns the lock named name if it is granted and unexpired at now.
func (t *Table) held(name string, now int64) (LockState, bool) {
	h, ok := t.locks[name]
	if !ok || h.Expires <= now {
		return LockState{}, false
	}
	return h, true
}

// current is the holder of name at now, or a free lock's name alone.
func (t *Table) current(name string, now int64) LockState {
	if h, ok := t.held(name, now); ok {
		return h
	}
	return LockState{Name: name}
}

// list returns the locks held at now, sorted by name.
func (t *Table) list(now int64) []LockState {
	var out []LockState
	for _, h := range t.locks {
		if now < h.Expires {
			out = append(out, h)
		}
	}
	tableSortByName(out)
	return out
}

// tick removes the locks expired at now, starting their lock-delay
// (lockDelay ms, the tick's), and forgets the lock-delays that have ended.
func (t *Table) tick(now, lockDelay int64) {
	for name, d := range t.delays {
		if d.Expires <= now {
			delete(t.delays, name)
		}
	}
	for name, h := range t.locks {
		if now < h.Expires {
			continue
		}
		delete(t.locks, name)
		if end := tableAddMillis(h.Expires, lockDelay); now < end {
			h.Expires = end
			t.delays[name] = h
		}
	}
	t.nextOK = false
}

// prune forgets the remembered results older than DedupeWindow at now.
func (t *Table) prune(now int64) {
	window := DedupeWindow.Milliseconds()
	t.seen.dropWhile(func(at int64) bool { return tableAddMillis(at, window) <= now })
}

// setLock stores ls, keeping the NextExpiry cache right.
func (t *Table) setLock(ls LockState) {
	if old, ok := t.locks[ls.Name]; ok {
		t.forgetExpiry(old.Expires)
	}
	t.locks[ls.Name] = ls
	t.noteExpiry(ls.Expires)
}

// deleteLock removes a grant, keeping the NextExpiry cache right.
func (t *Table) deleteLock(name string) {
	if old, ok := t.locks[name]; ok {
		t.forgetExpiry(old.Expires)
		delete(t.locks, name)
	}
}

// deleteDelay ends a lock-delay, keeping the NextExpiry cache right.
func (t *Table) deleteDelay(name string) {
	if old, ok := t.delays[name]; ok {
		t.forgetExpiry(old.Expires)
		delete(t.delays, name)
	}
}

// noteExpiry lowers the cached NextExpiry to e if e is earlier.
func (t *Table) noteExpiry(e int64) {
	if t.nextOK && (!t.nextHas || e < t.next) {
		t.next, t.nextHas = e, true
	}
}

// forgetExpiry drops the cache when the earliest expiry goes away.
func (t *Table) forgetExpiry(e int64) {
	if t.nextOK && t.nextHas && e == t.next {
		t.nextOK = false
	}
}

// NextExpiry is the earliest time (Unix ms) at which a tick changes
// something: a lock's expiry or the end of a lock-delay. It is 0 when
// nothing will expire; a time at or below 0 is reported as 1.
func (t *Table) NextExpiry() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.nextOK {
		t.next, t.nextHas = 0, false
		for _, m := range []map[string]LockState{t.locks, t.delays} {
			for _, l := range m {
				if !t.nextHas || l.Expires < t.next {
					t.next, t.nextHas = l.Expires, true
				}
			}
		}
		t.nextOK = true
	}
	if !t.nextHas {
		return 0
	}
	return max(t.next, 1)
}

// Now is the latest command Time applied (Unix ms).
func (t *Table) Now() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.now
}

// Snapshot serializes the whole table: grants, running lock-delays,
// remembered results and Now. Equal tables give equal bytes.
func (t *Table) Snapshot() ([]byte, error) {
	encode, _ := t.snapshotLater()
	return encode()
}

// snapshotLater captures the table as it is and returns a function that
// serializes that state, as Snapshot does, and may run on another
// goroutine while Apply goes on; and the number of items (grants,
// lock-delays, remembered results) the snapshot holds. The capture copies
// the grants; the remembered results, which a busy group has hundreds of
// thousands of, are shared (a view of seen's chunks, which the encoding
// reads where they are).
func (t *Table) snapshotLater() (func() ([]byte, error), int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	snap := tableSnapshot{
		Format: tableSnapFormat,
		Now:    t.now,
		Locks:  slices.Collect(maps.Values(t.locks)),
		Delays: slices.Collect(maps.Values(t.delays)),
	}
	seen := t.seen.view()
	items := len(snap.Locks) + len(snap.Delays) + t.seen.len()
	return func() ([]byte, error) {
		tableSortByName(snap.Locks) // copies, sorted here: off the caller's goroutine
		tableSortByName(snap.Delays)
		s := snap
		s.seenRaw = &seen
		b, err := encodeTableSnapshot(s)
		if err != nil {
			return nil, fmt.Errorf("paxos: snapshot table: %w", err)
		}
		return b, nil
	}, items
}

// Restore replaces the table's state with what Snapshot made (this
// build's format 3, or an earlier build's JSON formats 2 and 1; format 1's
// remembered results have no fingerprint: any request with such an ID
// gets its first result). On error the table is unchanged.
func (t *Table) Restore(data []byte) error {
	if len(data) == 0 {
		return errors.New("paxos: restore table: empty snapshot")
	}
	snap, err := decodeTableSnapshot(data)
	if err != nil {
		return fmt.Errorf("paxos: restore table: %w", err)
	}
	locks := make(map[string]LockState, len(snap.Locks))
	for _, l := range snap.Locks {
		locks[l.Name] = l
	}
	delays := make(map[string]LockState, len(snap.Delays))
	for _, d := range snap.Delays {
		delays[d.Name] = d
	}
	var seen seenLog
	for _, s := range snap.Seen {
		if _, dup := seen.find(s.ID); !dup {
			seen.push(s)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.now, t.locks, t.delays = snap.Now, locks, delays
	t.seen = seen
	t.nextOK = false
	return nil
}

// tableSortByName sorts locks by name.
func tableSortByName(ls []LockState) {
	slices.SortFunc(ls, func(a, b LockState) int { return strings.Compare(a.Name, b.Name) })
}

// tableAddMillis adds b to a, saturating instead of overflowing.
func tableAddMillis(a, b int64) int64 {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}
