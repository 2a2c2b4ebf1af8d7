package cluster

import "testing"

// SetRestoreHook makes Restore call f once etcd's restore has written its
// work directory, before it moves it into place, until the test ends.
func SetRestoreHook(t testing.TB, f func(dataDir, work string) error) {
	restoreHook = f
	t.Cleanup(func() { restoreHook = nil })
}
