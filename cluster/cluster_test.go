package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestMain(m *testing.M) {
	os.Exit(etcdtest.Main(m, nil, "", nil))
}

// embed starts a server in dir on free loopback ports; it is closed when the
// test ends, before dir is removed.
func embed(t *testing.T, dir string) *cluster.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := cluster.Embed(ctx, cluster.EmbedConfig{
		DataDir:   dir,
		ClientURL: "http://" + etcdtest.FreeAddr(),
		PeerURL:   "http://" + etcdtest.FreeAddr(),
	})
	if err != nil {
		t.Fatalf("embed in %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return srv
}

func TestEmbedKeepsDataAcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	ctx := context.Background()

	first := embed(t, dir)
	if first.DataDir() != dir {
		t.Fatalf("DataDir() = %s, want %s", first.DataDir(), dir)
	}
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: first.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(ctx, "/restart/key", "kept")
	if err != nil {
		t.Fatal(err)
	}
	_ = cli.Close()
	firstEndpoints := first.Endpoints()
	_ = first.Close(context.Background())
	if c, err := net.DialTimeout("tcp", firstEndpoints[0], time.Second); err == nil {
		_ = c.Close()
		t.Fatalf("first server still accepts connections on %s after Close", firstEndpoints[0])
	}

	second := embed(t, dir) // on new ports
	cli, err = cluster.Connect(ctx, cluster.ClientConfig{Endpoints: second.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	g, err := cli.Get(ctx, "/restart/key")
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "kept" {
		t.Fatalf("after restart /restart/key = %v, want %q", g.Kvs, "kept")
	}
	if g.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("key's revision %d after restart, want %d as written", g.Kvs[0].ModRevision, put.Header.Revision)
	}
}

func TestConnectUnreachable(t *testing.T) {
	addr := etcdtest.FreeAddr() // closed again: nothing listens there
	const timeout = time.Second
	start := time.Now()
	cli, err := cluster.Connect(context.Background(), cluster.ClientConfig{Endpoints: []string{addr}, DialTimeout: timeout})
	took := time.Since(start)
	if cli != nil {
		_ = cli.Close()
		t.Fatalf("Connect to %s, where nothing listens, returned a client", addr)
	}
	if took > 3*time.Second {
		t.Fatalf("Connect took %s with a dial timeout of %s", took.Round(time.Millisecond), timeout)
	}
	if !errors.Is(err, cluster.ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
	var ue *cluster.UnreachableError
	if !errors.As(err, &ue) || !reflect.DeepEqual(ue.Endpoints, []string{addr}) || ue.Timeout != timeout || ue.Err == nil {
		t.Fatalf("err = %#v, want an *UnreachableError for [%s] after %s with its cause", err, addr, timeout)
	}
	msg := err.Error()
	for _, want := range []string{addr, "start `drover server` or set ETCD_ENDPOINTS"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("message %q does not contain %q", msg, want)
		}
	}
	t.Logf("Connect failed after %s: %v", took.Round(time.Millisecond), err)
}

func TestConnectCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: []string{etcdtest.FreeAddr()}, DialTimeout: time.Second})
	if cli != nil {
		_ = cli.Close()
		t.Fatal("Connect with a cancelled context returned a client")
	}
	if !errors.Is(err, context.Canceled) || errors.Is(err, cluster.ErrUnreachable) {
		t.Fatalf("err = %v, want context.Canceled, not ErrUnreachable", err)
	}
}

func TestResolveEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		flag string
		env  string
		want []string
	}{
		{"flag beats env", "10.0.0.1:2379", "10.0.0.9:2379", []string{"10.0.0.1:2379"}},
		{"flag comma-separated and trimmed", " 10.0.0.1:2379 , http://10.0.0.2:2379,,10.0.0.3:2379 ", "10.0.0.9:2379", []string{"10.0.0.1:2379", "http://10.0.0.2:2379", "10.0.0.3:2379"}},
		{"env when no flag", "", "10.0.0.9:2379, 10.0.0.8:2379", []string{"10.0.0.9:2379", "10.0.0.8:2379"}},
		{"default when neither", "", "", []string{cluster.DefaultEndpoint}},
		{"default when env is blank", "", " , ", []string{cluster.DefaultEndpoint}},
		{"env when the flag is blank", " , ", "10.0.0.9:2379", []string{"10.0.0.9:2379"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(cluster.EnvEndpoints, tc.env)
			if got := cluster.ResolveEndpoints(tc.flag); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ResolveEndpoints(%q) with %s=%q = %q, want %q", tc.flag, cluster.EnvEndpoints, tc.env, got, tc.want)
			}
		})
	}
	if cluster.DefaultEndpoint != "127.0.0.1:2379" {
		t.Fatalf("DefaultEndpoint = %s, want 127.0.0.1:2379", cluster.DefaultEndpoint)
	}
}

func TestEmbedConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (cluster.EmbedConfig{}).Validate(); err != nil {
		t.Fatalf("zero EmbedConfig: %v, want valid (defaults)", err)
	}
	for _, tc := range []struct {
		name  string
		cfg   cluster.EmbedConfig
		field string
	}{
		{"client URL not a URL", cluster.EmbedConfig{ClientURL: "not a url"}, "ClientURL"},
		{"client URL not http", cluster.EmbedConfig{ClientURL: "ftp://x"}, "ClientURL"},
		{"client URL without host", cluster.EmbedConfig{ClientURL: "http://"}, "ClientURL"},
		{"peer URL not http", cluster.EmbedConfig{PeerURL: "ftp://x"}, "PeerURL"},
		{"client URL with a host name", cluster.EmbedConfig{ClientURL: "http://example.com:2379"}, "ClientURL"},
		{"client URL without a port", cluster.EmbedConfig{ClientURL: "http://127.0.0.1"}, "ClientURL"},
		{"client URL with a path", cluster.EmbedConfig{ClientURL: "http://127.0.0.1:2379/some/path"}, "ClientURL"},
		{"log level fatal", cluster.EmbedConfig{LogLevel: "fatal"}, "LogLevel"},
		{"log level", cluster.EmbedConfig{LogLevel: "loud"}, "LogLevel"},
		{"negative start timeout", cluster.EmbedConfig{StartTimeout: -time.Second}, "StartTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Validate() = %v, want an error naming %s", err, tc.field)
			}
			// Embed refuses it before touching the disk.
			tc.cfg.DataDir = filepath.Join(t.TempDir(), "data")
			srv, err := cluster.Embed(context.Background(), tc.cfg)
			if srv != nil {
				_ = srv.Close(context.Background())
				t.Fatal("Embed started a server with an invalid config")
			}
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Embed() = %v, want an error naming %s", err, tc.field)
			}
			if _, err := os.Stat(tc.cfg.DataDir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("Embed with an invalid config created its data dir (stat: %v)", err)
			}
		})
	}
}

func TestServerCloseTwice(t *testing.T) {
	t.Parallel()
	srv := embed(t, t.TempDir())
	addr := srv.Endpoints()[0]
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Close(context.Background())
		_ = srv.Close(context.Background())
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("two Close calls did not return within 10s")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Fatalf("server still accepts connections on %s after Close", addr)
	}
}

// Compaction frees space inside the database file; defragmentation gives it
// back, and only when enough of the file is free.
func TestDefragIfWorth(t *testing.T) {
	s, cli := etcdtest.StartOwn(t)
	ctx := context.Background()
	if did, err := s.DefragIfWorth(ctx, cli); err != nil || did {
		t.Fatalf("fresh database: defragmented=%t, %v", did, err)
	}
	big := strings.Repeat("x", 1<<20)
	for i := 0; i < 80; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("/big/%d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	del, err := cli.Delete(ctx, "/big/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, del.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	before, _ := cli.Status(ctx, s.Endpoints()[0])
	did, err := s.DefragIfWorth(ctx, cli)
	if err != nil || !did {
		t.Fatalf("after freeing 80 MiB (db %d MiB, in use %d MiB): defragmented=%t, %v", before.DbSize>>20, before.DbSizeInUse>>20, did, err)
	}
	after, _ := cli.Status(ctx, s.Endpoints()[0])
	if after.DbSize >= before.DbSize/2 {
		t.Fatalf("database %d MiB after defragmenting, was %d MiB", after.DbSize>>20, before.DbSize>>20)
	}
}
