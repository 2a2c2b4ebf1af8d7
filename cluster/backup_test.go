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
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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
	t.Parallel()
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
	put, err := cli.Put(ctx, "/"+ns+"/leased", "v", clientv3.WithLease(l.ID))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "backup.db")
	var seen int64
	res, err := cluster.Backup(ctx, cli, file, func(n int64) { seen = n })
	if err != nil {
		t.Fatal(err)
	}
	// Nothing was written between the put and the backup: the backup's
	// revision is the one the server acknowledged the put at.
	if res.Revision != put.Header.Revision {
		t.Fatalf("backup revision %d, want %d, the revision of the last write before it", res.Revision, put.Header.Revision)
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
	_ = old.Close(context.Background())

	bumped := restored(t, file, filepath.Join(dir, "bumped"), 0, res.Revision, "/"+ns+"/leased")
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

	kept := restored(t, file, filepath.Join(dir, "kept"), -1, res.Revision, "/"+ns+"/leased")
	if tok := lockToken(t, kept, ns); tok <= before || tok > after {
		t.Fatalf("token after a restore that keeps the revision: %d, want above %d (before the backup) and, here, at most %d (reissued)", tok, before, after)
	}
}

// restored restores file, a backup of revision backupRev, into dir with
// bump, starts a server on it and returns a client of it. It checks the
// revisions the restore reports against the backup's and against the
// revision the restored server serves, read through the client: the
// backup's, plus DefaultRevisionBump when bump is 0, and, when bumped,
// marked compacted. leased is a key of the backup bound to a lease, which
// expires a TTL after the restored server elects its leader and deletes
// the key with the store's first write: while the key is there the
// server's revision is the restored one, once it is gone one more.
func restored(t *testing.T, file, dir string, bump, backupRev int64, leased string) *clientv3.Client {
	t.Helper()
	res, err := cluster.Restore(cluster.RestoreConfig{Snapshot: file, DataDir: dir, RevisionBump: bump})
	if err != nil {
		t.Fatalf("restore into %s: %v", dir, err)
	}
	want := backupRev
	if bump == 0 {
		want += cluster.DefaultRevisionBump
	}
	if res.Revision != backupRev || res.Restored != want {
		t.Fatalf("restore with bump %d of a backup of revision %d: %+v, want revision %d, restored %d", bump, backupRev, res, backupRev, want)
	}
	cli := connect(t, embed(t, dir))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := cli.Get(ctx, leased)
	if err != nil {
		t.Fatal(err)
	}
	served := g.Header.Revision
	if len(g.Kvs) == 0 {
		served-- // the lease expired already, deleting the key
	}
	if served != want {
		t.Fatalf("the server restored with bump %d serves revision %d (leased key there: %v), want %d as the restore reported", bump, g.Header.Revision, len(g.Kvs) > 0, want)
	}
	if bump == 0 {
		if _, err := cli.Get(ctx, leased, clientv3.WithRev(want-1)); !errors.Is(err, rpctypes.ErrCompacted) {
			t.Fatalf("read at revision %d, below the bumped one: %v, want it compacted", want-1, err)
		}
	}
	return cli
}

// TestRestoreRefuses: a data dir that holds files, a checksum that does
// not match, a missing checksum and a damaged file are refused, and leave
// no data dir behind. A damaged file whose checksum file matches it is
// refused by etcd's checksum inside it, checked before the file is opened
// as a database (whose damaged header would fail otherwise, differently).
func TestRestoreRefuses(t *testing.T) {
	t.Parallel()
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
	// Both of bbolt's meta pages damaged: opened as a database, the file
	// fails there, with bbolt's error; verified first, with etcd's sum.
	header := append([]byte(nil), b...)
	header[20] ^= 0xff
	header[4096+20] ^= 0xff
	hsum := sha256.Sum256(header)
	headerFile := write("header.db", header)
	write("header.db.sha256", []byte(hex.EncodeToString(hsum[:])+"  header.db\n"))
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
		{"damaged header", cluster.RestoreConfig{Snapshot: headerFile}, func(err error) bool { return errors.Is(err, cluster.ErrChecksumMismatch) }, "does not end with the sha256 of its data"},
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

// TestBackupNeverOverwrites: a file that appears at FILE while the backup
// streams is left as it is, and the backup fails saying so; a second
// backup to FILE started while the first streams (its FILE.part exists)
// fails at once, saying another backup runs, and the first completes; a
// backup whose checksum file cannot be written removes FILE and FILE.part.
func TestBackupNeverOverwrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	cli := connect(t, embed(t, filepath.Join(dir, "src")))
	if _, err := cli.Put(ctx, "/never-overwrites", "v"); err != nil {
		t.Fatal(err)
	}
	gone := func(t *testing.T, paths ...string) {
		t.Helper()
		for _, p := range paths {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s left behind: %v", p, err)
			}
		}
	}

	t.Run("file appears", func(t *testing.T) {
		file := filepath.Join(dir, "appears.db")
		once := false
		_, err := cluster.Backup(ctx, cli, file, func(int64) {
			if !once {
				once = true
				if err := os.WriteFile(file, []byte("theirs"), 0o600); err != nil {
					t.Error(err)
				}
			}
		})
		if !errors.Is(err, cluster.ErrBackupExists) || !strings.Contains(err.Error(), file+" appeared while the backup ran") {
			t.Fatalf("Backup() = %v, want ErrBackupExists naming %s", err, file)
		}
		if b, err := os.ReadFile(file); err != nil || string(b) != "theirs" {
			t.Fatalf("the file that appeared: %q, %v; want it left as it was", b, err)
		}
		gone(t, file+".part", file+cluster.ChecksumSuffix)
	})

	t.Run("another backup runs", func(t *testing.T) {
		file := filepath.Join(dir, "twice.db")
		var second error
		once := false
		first, err := cluster.Backup(ctx, cli, file, func(int64) {
			if !once {
				once = true
				_, second = cluster.Backup(ctx, cli, file, nil)
			}
		})
		if err != nil {
			t.Fatalf("the first backup: %v", err)
		}
		if !errors.Is(second, cluster.ErrBackupExists) || !strings.Contains(second.Error(), "another backup to "+file+" is running") {
			t.Fatalf("the second backup, while the first streamed: %v; want ErrBackupExists saying another backup runs", second)
		}
		b, err := os.ReadFile(file)
		sum := sha256.Sum256(b)
		if err != nil || int64(len(b)) != first.Size || hex.EncodeToString(sum[:]) != first.SHA256 {
			t.Fatalf("the first backup's file: %d bytes, %v; want %d bytes with sha256 %s", len(b), err, first.Size, first.SHA256)
		}
		gone(t, file+".part")
	})

	t.Run("checksum cannot be written", func(t *testing.T) {
		file := filepath.Join(dir, "nosum.db")
		// A directory that holds a file: the checksum cannot be written
		// there, nor the directory removed.
		if err := os.MkdirAll(filepath.Join(file+cluster.ChecksumSuffix, "x"), 0o700); err != nil {
			t.Fatal(err)
		}
		_, err := cluster.Backup(ctx, cli, file, nil)
		if err == nil || !strings.Contains(err.Error(), "write the checksum "+file+cluster.ChecksumSuffix) {
			t.Fatalf("Backup() = %v, want it to fail writing the checksum", err)
		}
		gone(t, file, file+".part")
	})
}
