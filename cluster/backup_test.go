package cluster_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/etcdtest"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// lockToken takes and releases the lock "fence" in ns, and returns its
// fencing token.
func lockToken(t *testing.T, cli *clientv3.Client, ns string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	l, err := locker.AcquireFenced(ctx, "fence")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	return l.Token()
}

func connect(t *testing.T, s *cluster.Server) *clientv3.Client {
	t.Helper()
	cli, err := cluster.Connect(context.Background(), cluster.ClientConfig{Endpoints: s.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// TestBackupRestoreTokensAndLeases: a backup holds the data up to its
// revision; a restore keeps the revision counter, so that fencing tokens
// (create revisions) after it are higher than every token before the
// backup, and by default bumps it, so that they are higher than every
// token issued after the backup too; without the bump a token issued
// between the backup and the restore is issued again. A lease revoked
// after the backup comes back with its key and, renewed by nobody,
// expires by itself.
func TestBackupRestoreTokensAndLeases(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	old := embed(t, filepath.Join(dir, "old"))
	cli := connect(t, old)
	before := lockToken(t, cli, ns)
	l, err := cli.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/"+ns+"/leased", "v", clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "backup.db")
	var seen int64
	res, err := cluster.Backup(ctx, cli, file, func(n int64) { seen = n })
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(file)
	b, _ := os.ReadFile(file)
	sum := sha256.Sum256(b)
	line, _ := os.ReadFile(file + cluster.ChecksumSuffix)
	if st == nil || st.Size() != res.Size || seen != res.Size || res.SHA256 != hex.EncodeToString(sum[:]) ||
		string(line) != res.SHA256+"  backup.db\n" || res.Revision <= before {
		t.Fatalf("backup %+v: file size %v, progress %d, checksum file %q, token before %d", res, st, seen, line, before)
	}
	if _, err := os.Stat(file + ".part"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s.part left behind: %v", file, err)
	}
	if _, err := cluster.Backup(ctx, cli, file, nil); !errors.Is(err, cluster.ErrBackupExists) {
		t.Fatalf("second backup to the same file: %v", err)
	}
	// Another backup to a file is running (its .part exists): refused,
	// and the other's .part is left alone.
	other := filepath.Join(dir, "other.db")
	if err := os.WriteFile(other+".part", []byte("in progress"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Backup(ctx, cli, other, nil); !errors.Is(err, cluster.ErrBackupExists) || !strings.Contains(err.Error(), "another backup") {
		t.Fatalf("backup while another to the same file runs: %v", err)
	}
	if b, err := os.ReadFile(other + ".part"); err != nil || string(b) != "in progress" {
		t.Fatalf("the other backup's .part: %q, %v", b, err)
	}
	if _, err := os.Stat(other); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused backup wrote %s: %v", other, err)
	}
	if _, err := cli.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	var after int64
	for i := 0; i < 5; i++ {
		after = lockToken(t, cli, ns)
	}
	old.Close()

	bumped := restored(t, file, filepath.Join(dir, "bumped"), 0)
	g, err := bumped.Get(ctx, "/"+ns+"/leased")
	if err != nil || len(g.Kvs) != 1 || clientv3.LeaseID(g.Kvs[0].Lease) != l.ID {
		t.Fatalf("leased key after restore: %v, %v", g, err)
	}
	ttl, err := bumped.TimeToLive(ctx, l.ID)
	if err != nil || ttl.TTL <= 0 || ttl.GrantedTTL != 5 {
		t.Fatalf("restored lease: %+v, %v", ttl, err)
	}
	if tok := lockToken(t, bumped, ns); tok <= after || tok <= res.Revision+cluster.DefaultRevisionBump {
		t.Fatalf("token after a bumped restore %d: want above %d (issued after the backup) and the bumped revision", tok, after)
	}
	waitUntil(t, 15*time.Second, "the restored lease to expire", func() bool { return !exists(t, bumped, "/"+ns+"/leased") })

	kept := restored(t, file, filepath.Join(dir, "kept"), -1)
	if tok := lockToken(t, kept, ns); tok <= before || tok > after {
		t.Fatalf("token after a restore that keeps the revision: %d, want above %d (before the backup) and, here, at most %d (reissued)", tok, before, after)
	}
}

// restored restores file into dir with bump, starts a server on it and
// returns a client of it.
func restored(t *testing.T, file, dir string, bump int64) *clientv3.Client {
	t.Helper()
	res, err := cluster.Restore(cluster.RestoreConfig{Snapshot: file, DataDir: dir, RevisionBump: bump})
	if err != nil {
		t.Fatalf("restore into %s: %v", dir, err)
	}
	if bump < 0 && res.Restored != res.Revision || bump == 0 && res.Restored != res.Revision+cluster.DefaultRevisionBump {
		t.Fatalf("restore with bump %d: %+v", bump, res)
	}
	return connect(t, embed(t, dir))
}

// TestRestoreRefuses: a data dir that holds files, a checksum that does
// not match, a missing checksum and a damaged file are refused, and leave
// no data dir behind.
func TestRestoreRefuses(t *testing.T) {
	dir := t.TempDir()
	s := embed(t, filepath.Join(dir, "src"))
	file := filepath.Join(dir, "b.db")
	if _, err := cluster.Backup(context.Background(), connect(t, s), file, nil); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(file)
	damaged := append([]byte(nil), b...)
	damaged[len(damaged)/2] ^= 0xff
	sum := sha256.Sum256(damaged)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	damagedFile := write("damaged.db", damaged)
	write("damaged.db.sha256", []byte(hex.EncodeToString(sum[:])+"  damaged.db\n"))
	mismatch := write("mismatch.db", b)
	write("mismatch.db.sha256", []byte(hex.EncodeToString(sum[:])+"  mismatch.db\n"))
	bare := write("bare.db", b)
	full := filepath.Join(dir, "full")
	if err := os.Mkdir(full, 0o700); err != nil {
		t.Fatal(err)
	}
	write("full/x", nil)
	for _, tc := range []struct {
		name string
		cfg  cluster.RestoreConfig
		want func(error) bool
		says string
	}{
		{"data dir holds files", cluster.RestoreConfig{Snapshot: file, DataDir: full}, func(err error) bool { return errors.Is(err, drover.ErrInvalidInput) }, "must be a new or empty directory"},
		{"checksum mismatch", cluster.RestoreConfig{Snapshot: mismatch}, func(err error) bool { return errors.Is(err, cluster.ErrChecksumMismatch) }, "is damaged or is not the backup that checksum belongs to"},
		{"given checksum mismatch", cluster.RestoreConfig{Snapshot: file, SHA256: hex.EncodeToString(sum[:])}, func(err error) bool { return errors.Is(err, cluster.ErrChecksumMismatch) }, "--sha256"},
		{"no checksum", cluster.RestoreConfig{Snapshot: bare}, func(err error) bool { return errors.Is(err, cluster.ErrNoChecksum) }, "bare.db.sha256 does not exist"},
		{"damaged inside", cluster.RestoreConfig{Snapshot: damagedFile}, func(err error) bool { return errors.Is(err, cluster.ErrChecksumMismatch) }, "does not end with the sha256 of its data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := tc.cfg.DataDir
			if target == "" {
				target = filepath.Join(dir, "out-"+strings.ReplaceAll(tc.name, " ", "-"))
				tc.cfg.DataDir = target
			}
			_, err := cluster.Restore(tc.cfg)
			if !tc.want(err) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Restore() = %v, want an error saying %q", err, tc.says)
			}
			if target != full {
				if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("a refused restore left %s (%v)", target, err)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*.restoring-*")); len(left) > 0 {
				t.Fatalf("a refused restore left %v", left)
			}
		})
	}
}
