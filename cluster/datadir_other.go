//go:build !unix

package cluster

// lockDataDir does nothing where flock is not available: etcd's own lock on
// its database still keeps a second server out, by making it wait.
func lockDataDir(string) (func(), error) { return func() {}, nil }
