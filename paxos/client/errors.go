package client

import (
	"errors"
	"fmt"
	"net/http"
)

// Errors of the Client. Each answer the API gives maps to one; typed
// errors carry the details.
var (
	// ErrHeld: another owner holds the lock (*HeldError).
	ErrHeld = errors.New("paxos: lock held by another owner")
	// ErrNotHeld: the owner and token do not hold the lock (*NotHeldError).
	ErrNotHeld = errors.New("paxos: lock not held with this owner and token")
	// ErrNotFound: nobody holds the lock.
	ErrNotFound = errors.New("paxos: lock not found or expired")
	// ErrBadRequest: the node refused the request as malformed (*APIError).
	ErrBadRequest = errors.New("paxos: bad request")
	// ErrTimeout: no quorum applied the request in time (the API's 504).
	// The request may still be applied later; a retry with the same
	// Idempotency-Key is applied once.
	ErrTimeout = errors.New("paxos: timed out waiting for consensus")
	// ErrUnreachable: no endpoint answered.
	ErrUnreachable = errors.New("paxos: no node answered")
)

// HeldError says who holds a lock that could not be taken.
type HeldError struct {
	Lock   string
	Holder LockInfo
}

// Error implements error.
func (e *HeldError) Error() string {
	return fmt.Sprintf("paxos: lock %q is held by owner %q with token %d", e.Lock, e.Holder.Owner, e.Holder.Token)
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// NotHeldError says that a release or renewal named an owner and token
// that do not hold the lock.
type NotHeldError struct {
	Lock  string
	Token uint64
	// Current is the holder when the lock is held by someone else, nil
	// when it is free.
	Current *LockInfo
}

// Error implements error.
func (e *NotHeldError) Error() string {
	if e.Current == nil {
		return fmt.Sprintf("paxos: lock %q is not held with token %d: it is free", e.Lock, e.Token)
	}
	return fmt.Sprintf("paxos: lock %q is not held with token %d: owner %q holds it with token %d", e.Lock, e.Token, e.Current.Owner, e.Current.Token)
}

// Unwrap returns ErrNotHeld.
func (e *NotHeldError) Unwrap() error { return ErrNotHeld }

// APIError is an answer the client has no better error for: the status
// and the node's message. A 504 matches ErrTimeout, a 400 ErrBadRequest.
type APIError struct {
	Endpoint   string
	StatusCode int
	Message    string
}

// Error implements error.
func (e *APIError) Error() string {
	return fmt.Sprintf("paxos: %s answered %d: %s", e.Endpoint, e.StatusCode, e.Message)
}

// Unwrap returns ErrTimeout for a 504 and ErrBadRequest for a 400.
func (e *APIError) Unwrap() error {
	switch e.StatusCode {
	case http.StatusGatewayTimeout:
		return ErrTimeout
	case http.StatusBadRequest:
		return ErrBadRequest
	}
	return nil
}
