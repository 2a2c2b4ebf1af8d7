package cli_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestServerDisarmsNOSPACE: a real `drover server`, with its embedded etcd
// of a 32 MiB quota or in front of an external one (an etcd of this test,
// same quota), guards the store. Another writer fills etcd past the quota
// with raw puts: the guard key is set past the high-water mark on the way,
// then etcd raises its NOSPACE alarm and refuses lease grants. Once the
// writer deletes what it wrote, the server compacts, defragments and
// disarms the alarm by itself, logging each step: lease grants and puts
// work again and the guard key is gone.
func TestServerDisarmsNOSPACE(t *testing.T) {
	const quota = 32 << 20
	for _, mode := range []string{"embedded", "external"} {
		t.Run(mode, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			args := []string{"--namespace", ns, "--high-water", "40%", "--low-water", "30%"}
			var endpoint string
			if mode == "embedded" {
				args = append(append(serverArgs(filepath.Join(t.TempDir(), "data")), args...), "--quota-backend-bytes", fmt.Sprint(quota))
			} else {
				srv, _ := etcdtest.QuotaServer(t, quota)
				endpoint = srv.Endpoints()[0]
				args = append([]string{"server", "--etcd-endpoints", endpoint}, args...)
			}
			p := start(t, cleanEnv(), args...)
			t.Cleanup(func() { // the guard's log says why a wait below timed out
				if t.Failed() {
					t.Logf("server stderr:\n%s", p.stderr.String())
				}
			})
			waitFor(t, 30*time.Second, "the server ready", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
			if mode == "embedded" {
				endpoint = readyEndpoint(p)
			}
			// Longer than the waits below together (each bounded), so that
			// a slow run under load does not end the test's own client
			// calls and leave a wait failing on a Get that no longer works.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c := connectTo(ctx, t, endpoint)
			keys := keyspace.MustNew(ns)
			filler := keys.Root() + "filler/"
			big := strings.Repeat("x", 1<<20)
			var refused error
			began := time.Now()
			for i := 0; i < 60 && refused == nil; i++ { // 60 MiB at most: past the 32 MiB quota
				_, refused = c.Put(ctx, fmt.Sprintf("%s%03d", filler, i), big)
				if i == 13 { // past 40 %: the guard sets its key (raw puts go on regardless)
					// The guard checks every 2 s; a full `go test -race ./...`
					// run on two cores once waited more than 30 s for it
					// here: the wait only guards against a guard that never
					// sets it. Its failure says what the last read saw.
					// Well below the quota: etcd's database grows by more
					// than the data put (21 MiB of puts once made it 32.1
					// MiB and raised NOSPACE before the guard's next check,
					// so that its own key could not be written).
					t.Logf("14 puts of 1 MiB took %s", time.Since(began).Round(time.Millisecond))
					last := "no read yet"
					t.Cleanup(func() {
						if t.Failed() {
							t.Logf("the last read of the guard key: %s", last)
						}
					})
					waitFor(t, 90*time.Second, "the guard key past the high-water mark", func() bool {
						g, err := c.Get(ctx, keys.StoreFull())
						if err != nil {
							last = fmt.Sprintf("read the guard key: %v", err)
							return false
						}
						last = fmt.Sprintf("%d guard key(s) at revision %d", len(g.Kvs), g.Header.Revision)
						return len(g.Kvs) == 1
					})
				}
			}
			if !errors.Is(refused, rpctypes.ErrNoSpace) {
				t.Fatalf("filling a 32 MiB store: %v, want %v", refused, rpctypes.ErrNoSpace)
			}
			if _, err := c.Grant(ctx, 5); !errors.Is(err, rpctypes.ErrNoSpace) {
				t.Fatalf("lease grant under NOSPACE: %v, want %v", err, rpctypes.ErrNoSpace)
			}
			waitFor(t, 10*time.Second, "the server to say the alarm is raised", func() bool {
				return strings.Contains(p.stderr.String(), "NOSPACE alarm is raised")
			})
			if _, err := c.Delete(ctx, filler, clientv3.WithPrefix()); err != nil {
				t.Fatalf("delete under NOSPACE: %v", err)
			}
			waitFor(t, 40*time.Second, "the server to disarm the alarm", func() bool {
				a, err := c.AlarmList(ctx)
				return err == nil && len(a.Alarms) == 0
			})
			for _, want := range []string{"compacted etcd's history", "defragmented", "disarmed etcd's NOSPACE alarm", "accepted again"} {
				waitFor(t, 10*time.Second, fmt.Sprintf("the server's log to say %q", want), func() bool { return strings.Contains(p.stderr.String(), want) })
			}
			if _, err := c.Grant(ctx, 5); err != nil {
				t.Fatalf("lease grant after the server disarmed: %v", err)
			}
			if _, err := c.Put(ctx, filler+"again", "x"); err != nil {
				t.Fatalf("put after the server disarmed: %v", err)
			}
			// "accepted again" is in the disarm's line too: the guard
			// deletes its key on a check after that one.
			waitFor(t, 30*time.Second, "the guard key gone after recovery", func() bool {
				g, err := c.Get(ctx, keys.StoreFull())
				return err == nil && len(g.Kvs) == 0
			})
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			if code := p.wait(t, 20*time.Second); code != 0 {
				t.Fatalf("server: exit %d; stderr:\n%s", code, p.stderr.String())
			}
		})
	}
}
