package etcdtest

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// QuotaServer embeds a server of its own whose database quota is quota
// bytes, with neither the server's own defragmentation nor its periodic
// compaction (tests of the store guard run those), and returns it with a
// client; both end with the test.
func QuotaServer(tb testing.TB, quota int64) (*cluster.Server, *clientv3.Client) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := cluster.Embed(ctx, cluster.EmbedConfig{
		DataDir:                 tb.TempDir(),
		ClientURL:               "http://" + FreeAddr(),
		PeerURL:                 "http://" + FreeAddr(),
		UnsafeNoFsync:           true,
		QuotaBackendBytes:       quota,
		DefragInterval:          -1,
		AutoCompactionRetention: -1,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close(context.Background()) })
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: s.Endpoints()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return s, cli
}

// LogBuffer collects log lines (a slog handler's output); safe for
// concurrent use.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// NewGuard returns a store guard of cli's server configured by cfg, not
// started; it is closed when the test ends.
func NewGuard(tb testing.TB, cli *clientv3.Client, cfg cluster.GuardConfig) *cluster.Guard {
	tb.Helper()
	g, err := cluster.NewGuard(cli, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Close(ctx); err != nil {
			tb.Error(err)
		}
	})
	return g
}

// Eventually polls cond every 50 ms for at most d and reports whether it
// held.
func Eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}
