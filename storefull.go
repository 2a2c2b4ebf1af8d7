package drover

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrStoreFull is matched (with errors.Is) by every error that refuses a
// data-plane write (a task submission, a checkpoint) because etcd's database
// is near its quota. Nothing is written when an operation returns one; the
// same write succeeds once space has been freed.
var ErrStoreFull = errors.New("drover: store full")

// StoreFullError says how full etcd's database is and what to do about it.
// The server's guard stores it, as JSON, in the namespace's guard key
// (keyspace.Space.StoreFull) while usage is past the high-water mark; data
// plane writers return it while the key exists, so that etcd never reaches
// its quota and leases and locks (the control plane) keep working.
type StoreFullError struct {
	// Usage is the size of etcd's database file, in bytes, when the guard
	// set the key (etcd's quota counts this size); for a write the server
	// refused before sending it (storeguard.Admission), the size the write
	// would have brought the file to.
	Usage int64 `json:"usage"`
	// Quota is etcd's database quota (its --quota-backend-bytes), in bytes.
	Quota int64 `json:"quota"`
	// HighWater is the fraction of Quota past which data-plane writes are
	// refused.
	HighWater float64 `json:"high_water"`
	// LowWater is the fraction of Quota that the space in use must fall
	// under before they are accepted again.
	LowWater float64 `json:"low_water"`
	// Since is when the guard began refusing data-plane writes.
	Since time.Time `json:"since,omitzero"`
}

// Error implements error. It says how full the store is, that leases and
// locks still work, and how to free space or raise the quota.
func (e *StoreFullError) Error() string {
	pct := 0.0
	if e.Quota > 0 {
		pct = 100 * float64(e.Usage) / float64(e.Quota)
	}
	return fmt.Sprintf("store full: etcd's database uses %s of its %s quota (%.0f%%, past the %.0f%% high-water mark): "+
		"new tasks, checkpoints, signals and stream events are refused so that leases and locks keep working; "+
		"free space with `drover tasks purge --queue Q --status SUCCEEDED --all` (or `drover dlq purge --queue Q --all`), "+
		"or restart `drover server` with a larger --quota-backend-bytes; writes resume once less than %.0f%% is in use",
		formatBytes(e.Usage), formatBytes(e.Quota), pct, 100*e.HighWater, 100*e.LowWater)
}

// Unwrap returns ErrStoreFull.
func (e *StoreFullError) Unwrap() error { return ErrStoreFull }

// Value encodes e as the guard key's value (JSON).
func (e *StoreFullError) Value() string {
	b, _ := json.Marshal(e) // a struct of numbers and a time: cannot fail
	return string(b)
}

// ParseStoreFull decodes a guard key's value, as [StoreFullError.Value]
// wrote it.
func ParseStoreFull(value []byte) (*StoreFullError, error) {
	e := new(StoreFullError)
	if err := json.Unmarshal(value, e); err != nil {
		return nil, fmt.Errorf("drover: store-full guard value %q: %w", value, err)
	}
	return e, nil
}

// formatBytes prints a size in bytes: "512 B", "45.0 MiB", "3.2 GiB".
func formatBytes(n int64) string {
	switch {
	case n >= 1<<30 || n <= -1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20 || n <= -1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 || n <= -1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
