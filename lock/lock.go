package lock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
)

// Locker acquires named locks on one backend. Implementations are safe for
// concurrent use.
type Locker interface {
	// TryAcquire makes one attempt to take name. When another holder has
	// it, the error is a *HeldError (errors.Is(err, ErrHeld)) that says who.
	TryAcquire(ctx context.Context, name string) (Lock, error)
	// Acquire waits, first come first served, until it holds name or ctx is
	// done; the deadline of ctx is the wait bound. When ctx ends first the
	// error is a *HeldError that also matches ctx's error.
	Acquire(ctx context.Context, name string) (Lock, error)
	// Release releases name if this locker holds it with token. Any other
	// token, stale or unknown, and any other locker, even one that knows
	// the token, is refused with a *NotHeldError (errors.Is(err,
	// ErrNotHeld)) and nothing changes.
	Release(ctx context.Context, name string, token int64) error
	// Status tells who holds name, or that it is free.
	Status(ctx context.Context, name string) (Status, error)
	// List returns the status of every held lock, ordered by name.
	List(ctx context.Context) ([]Status, error)
}

// Lock is one holding of a named lock.
type Lock interface {
	// Name is the lock's name.
	Name() string
	// Token is the fencing token: it strictly increases, per lock name,
	// each time the lock changes hands. Pass it to whatever the holder
	// writes, so a write made after the lock was lost can be refused.
	Token() int64
	// Holder describes this holder as it is recorded in the backend.
	Holder() Holder
	// Context is cancelled the moment the lock is lost or released;
	// context.Cause says which (ErrLost or ErrReleased).
	Context() context.Context
	// Release gives the lock up, if it is still held with this token, and
	// cancels Context. Releasing a lock that was lost returns a
	// *NotHeldError.
	Release(ctx context.Context) error
}

// Sentinel errors. Each has a typed error that carries the details.
var (
	// ErrHeld: another holder has the lock (*HeldError).
	ErrHeld = errors.New("lock: held by another holder")
	// ErrNotHeld: a release or a check named a token that does not hold
	// the lock (*NotHeldError).
	ErrNotHeld = errors.New("lock: not held")
	// ErrFenced: a write fenced by a lock was refused because the lock is
	// no longer held with that token.
	// It is lease.ErrFenced: every right fences the same way.
	ErrFenced = lease.ErrFenced
	// ErrLost is matched by the cause of a lost lock's context.
	ErrLost = errors.New("lock: lost")
	// ErrReleased is the cause of a released lock's context.
	ErrReleased = errors.New("lock: released")
)

// Holder records who holds (or waits for) a lock, so operators can see it.
type Holder struct {
	// ID names the worker: by default "host:pid".
	ID string `json:"id"`
	// Host is the holder's host name.
	Host string `json:"host"`
	// PID is the holder's process id.
	PID int `json:"pid"`
	// AcquiredAt is when the lock was taken.
	AcquiredAt time.Time `json:"acquired_at"`
}

// NewHolder describes the current process, with id as its ID ("" means
// "host:pid").
func NewHolder(id string) Holder {
	host := hostname()
	if host == "" {
		host = "unknown"
	}
	pid := os.Getpid()
	if id == "" {
		id = fmt.Sprintf("%s:%d", host, pid)
	}
	return Holder{ID: id, Host: host, PID: pid}
}

// hostname is os.Hostname, read once: servers make a holder per request.
var hostname = sync.OnceValue(func() string { h, _ := os.Hostname(); return h })

// String describes the holder in one phrase, for messages.
func (h Holder) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (host %s, pid %d", h.ID, h.Host, h.PID)
	if !h.AcquiredAt.IsZero() {
		fmt.Fprintf(&b, ", since %s", h.AcquiredAt.UTC().Format(time.RFC3339))
	}
	b.WriteString(")")
	return b.String()
}

// Status is what a backend knows of one lock.
type Status struct {
	// Name is the lock's name.
	Name string
	// Held is false when nobody holds the lock.
	Held bool
	// Holder and Token describe the current holder when Held.
	Holder Holder
	Token  int64
	// TTL is how long the holder's right lasts unless renewed; negative
	// when the backend cannot tell.
	TTL time.Duration
	// Waiters counts contenders queued behind the holder.
	Waiters int
}

// HeldError says that a lock is held by someone else.
type HeldError struct {
	Name   string
	Holder Holder
	Token  int64
	// Err is the context error when a wait bound ended the attempt.
	Err error
}

// Error implements error.
func (e *HeldError) Error() string {
	who := "another holder"
	if e.Holder.ID != "" {
		who = e.Holder.String()
	}
	msg := fmt.Sprintf("lock %q is held by %s, token %d", e.Name, who, e.Token)
	if e.Err != nil {
		msg += fmt.Sprintf(" (gave up waiting: %v)", e.Err)
	}
	return msg
}

// Unwrap returns ErrHeld and, after a wait, the context's error.
func (e *HeldError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrHeld, e.Err}
	}
	return []error{ErrHeld}
}

// NotHeldError says that a token does not hold a lock.
type NotHeldError struct {
	Name  string
	Token int64
	// Current is the lock's status when it was checked.
	Current Status
}

// Error implements error.
func (e *NotHeldError) Error() string {
	if !e.Current.Held {
		return fmt.Sprintf("lock %q is not held by token %d: the lock is free", e.Name, e.Token)
	}
	if e.Current.Token == e.Token {
		return fmt.Sprintf("lock %q token %d is held by %s: only its holder can release it", e.Name, e.Token, e.Current.Holder)
	}
	return fmt.Sprintf("lock %q is not held by token %d: it is held by %s with token %d",
		e.Name, e.Token, e.Current.Holder, e.Current.Token)
}

// Unwrap returns ErrNotHeld.
func (e *NotHeldError) Unwrap() error { return ErrNotHeld }

// LostError is the cause of a lost lock's context.
type LostError struct {
	Name  string
	Token int64
	Cause error
}

// Error implements error.
func (e *LostError) Error() string {
	return fmt.Sprintf("lock %q (token %d) lost: %v", e.Name, e.Token, e.Cause)
}

// Unwrap returns ErrLost and the cause.
func (e *LostError) Unwrap() []error { return []error{ErrLost, e.Cause} }

// CheckName returns a drover.InputError unless name is a valid lock name.
func CheckName(name string) error { return keyspace.CheckName("name", name) }
