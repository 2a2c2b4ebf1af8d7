package cluster_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// backupOf writes a key to a new server in dir/src, backs it up into
// dir/b.db and returns the file.
func backupOf(t *testing.T, dir string) string {
	t.Helper()
	ctx := context.Background()
	cli := connect(t, embed(t, filepath.Join(dir, "src")))
	if _, err := cli.Put(ctx, "/restore-test/key", "backed up"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "b.db")
	if _, err := cluster.Backup(ctx, cli, file, nil); err != nil {
		t.Fatal(err)
	}
	return file
}

// leftovers fails the test if a restore's work directory is left beside
// or inside dir.
func leftovers(t *testing.T, dir string) {
	t.Helper()
	for _, pattern := range []string{dir + ".restoring-*", filepath.Join(dir, ".restoring-*")} {
		if left, _ := filepath.Glob(pattern); len(left) > 0 {
			t.Fatalf("a restore left %v", left)
		}
	}
}

// TestRestoreIntoEmptyDir: a restore into an existing empty directory
// (such as a mount point, or one made with its owner and mode) fills that
// directory, which keeps its mode, leaves no work directory, and a server
// started on it serves the backup's data.
func TestRestoreIntoEmptyDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := backupOf(t, dir)
	target := filepath.Join(dir, "empty")
	if err := os.Mkdir(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(target, 0o750); err != nil { // whatever the umask
		t.Fatal(err)
	}
	before, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Restore(cluster.RestoreConfig{Snapshot: file, DataDir: target}); err != nil {
		t.Fatalf("restore into an empty directory: %v", err)
	}
	after, err := os.Stat(target)
	if err != nil || !os.SameFile(before, after) || after.Mode().Perm() != 0o750 || !cluster.HasMember(target) {
		t.Fatalf("the data dir after the restore: %v, %v (same directory: %v, member: %v); want the same directory, mode 0750, holding a member",
			after, err, after != nil && os.SameFile(before, after), cluster.HasMember(target))
	}
	leftovers(t, target)
	g, err := connect(t, embed(t, target)).Get(context.Background(), "/restore-test/key")
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "backed up" {
		t.Fatalf("the restored server's key: %v, %v", g, err)
	}
}

// TestRestoreStagesItsWork: while etcd's restore writes, and until the
// restore is complete, the data dir holds no member: the restore writes a
// work directory beside a new data dir (DIR.restoring-*) or inside an
// existing empty one (DIR/.restoring-*), so that a restore interrupted
// there leaves nothing a server would start on. A restore that fails there
// removes its work directory; a server started on the data dir while one
// is left is refused, naming it.
func TestRestoreStagesItsWork(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := backupOf(t, dir)
	for _, tc := range []struct {
		name   string
		exists bool
	}{{"new data dir", false}, {"existing empty data dir", true}} {
		t.Run(tc.name, func(t *testing.T) {
			target := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			wantWork := target + ".restoring-"
			if tc.exists {
				if err := os.Mkdir(target, 0o700); err != nil {
					t.Fatal(err)
				}
				wantWork = filepath.Join(target, ".restoring-")
			}
			interrupted := errors.New("interrupted by the test")
			var seen string
			cluster.SetRestoreHook(t, target, func(dataDir, work string) error {
				seen = work
				if dataDir != target || !strings.HasPrefix(work, wantWork) || cluster.HasMember(target) || !cluster.HasMember(work) {
					t.Errorf("while restoring: data dir %s (member: %v), work %s (member: %v); want the member in a work directory %s*",
						dataDir, cluster.HasMember(target), work, cluster.HasMember(work), wantWork)
				}
				// A server started now would be refused.
				cfg := cluster.EmbedConfig{DataDir: target, ClientURL: "http://" + etcdtest.FreeAddr(), PeerURL: "http://" + etcdtest.FreeAddr()}
				if s, err := cluster.Embed(context.Background(), cfg); !errors.Is(err, cluster.ErrRestoreLeftover) || !strings.Contains(err.Error(), work) {
					if s != nil {
						_ = s.Close(context.Background())
					}
					t.Errorf("a server started on %s during a restore: %v; want ErrRestoreLeftover naming %s", target, err, work)
				}
				return interrupted
			})
			_, err := cluster.Restore(cluster.RestoreConfig{Snapshot: file, DataDir: target})
			if !errors.Is(err, interrupted) || seen == "" {
				t.Fatalf("Restore() = %v (hook called: %v), want the hook's error", err, seen != "")
			}
			leftovers(t, target)
			if cluster.HasMember(target) {
				t.Fatalf("a failed restore left a member in %s", target)
			}
			if names, _ := os.ReadDir(target); len(names) > 0 || !tc.exists && !errors.Is(statErr(target), os.ErrNotExist) {
				t.Fatalf("a failed restore left %s with %v (%v)", target, names, statErr(target))
			}
		})
	}
}

// statErr is the error of os.Stat(path).
func statErr(path string) error {
	_, err := os.Stat(path)
	return err
}
