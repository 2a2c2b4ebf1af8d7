package cluster

import (
	"path/filepath"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// SetRestoreHook makes a Restore into dataDir call f once etcd's restore
// has written its work directory, before it moves it into place, until the
// test ends. Restores into other directories do not call it.
func SetRestoreHook(t testing.TB, dataDir string, f func(dataDir, work string) error) {
	restoreHooks.Store(filepath.Clean(dataDir), f)
	t.Cleanup(func() { restoreHooks.Delete(filepath.Clean(dataDir)) })
}

// SetListedHook makes a join's wait for the members to list it go by
// f(endpoint, members) instead of the members a member listed, until the
// test ends.
func SetListedHook(t testing.TB, f func(endpoint string, members []*pb.Member) []*pb.Member) {
	listedHook = f
	t.Cleanup(func() { listedHook = nil })
}

// SetListedTimeouts sets how long a join waits for the members to list it
// and how long it waits for one member's list, until the test ends.
func SetListedTimeouts(t testing.TB, wait, call time.Duration) {
	oldWait, oldCall := listedWait, listedCallTimeout
	listedWait, listedCallTimeout = wait, call
	t.Cleanup(func() { listedWait, listedCallTimeout = oldWait, oldCall })
}

// SetJoinStartHook makes each start of a joining member call f first (try
// counts from 1); an error f returns fails that start, until the test ends.
func SetJoinStartHook(t testing.TB, f func(dataDir string, try int) error) {
	joinStartHook = f
	t.Cleanup(func() { joinStartHook = nil })
}

// JoinStartTries is how many times a join starts its member before it gives
// up on a start that a lagging member refused.
const JoinStartTries = joinStartTries
