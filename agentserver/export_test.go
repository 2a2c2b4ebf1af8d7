package agentserver

import (
	"context"
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SetStreamKeepalive sets how often a quiet SSE answer sends a comment,
// until the returned restore is called.
func SetStreamKeepalive(d time.Duration) (restore func()) {
	old := streamKeepalive
	streamKeepalive = d
	return func() { streamKeepalive = old }
}

// SetStoreScanLimit sets how many keys one store search or namespace
// listing examines, until the returned restore is called.
func SetStoreScanLimit(n int) (restore func()) {
	old := maxStoreScan
	maxStoreScan = n
	return func() { maxStoreScan = old }
}

// CreateOnceOn writes value at key of namespace ns through cli once, as
// the creates of assistants and threads do (createOnce), and answers the
// value stored before when key was taken and doNothing.
func CreateOnceOn(ctx context.Context, cli *clientv3.Client, ns, what, key, value string, doNothing bool) (json.RawMessage, error) {
	s := &server{cfg: Config{Etcd: cli, Namespace: func(context.Context) string { return ns }, Now: time.Now}}
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	old, err := createOnce[json.RawMessage](ctx, s, sp, what, key, sp.Root()+key, []clientv3.Op{clientv3.OpPut(sp.Root()+key, value)}, doNothing)
	if old == nil {
		return nil, err
	}
	return *old, err
}

// SetBeforeRunLock sets a function a run's start calls before it takes
// the thread's lock, until the returned restore is called.
func SetBeforeRunLock(f func()) (restore func()) {
	old := beforeRunLock
	beforeRunLock = f
	return func() { beforeRunLock = old }
}

// SetAfterRunClaim sets a function a run's start calls after it read the
// run's claim, before it appends its events, until restore is called.
func SetAfterRunClaim(f func()) (restore func()) {
	old := afterRunClaim
	afterRunClaim = f
	return func() { afterRunClaim = old }
}

// SetBeforePruneCommit sets a function a keep_latest prune calls once it
// has read what it keeps, before it writes, until restore is called.
func SetBeforePruneCommit(f func()) (restore func()) {
	old := beforePruneCommit
	beforePruneCommit = f
	return func() { beforePruneCommit = old }
}

// SetAfterCopyCheckpoints sets a function a copy calls with the new
// thread's id once it wrote its checkpoints, until restore is called.
func SetAfterCopyCheckpoints(f func(id string)) (restore func()) {
	old := afterCopyCheckpoints
	afterCopyCheckpoints = f
	return func() { afterCopyCheckpoints = old }
}
