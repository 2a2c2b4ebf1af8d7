package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
)

// ChecksumSuffix is appended to a backup's path to name its checksum file,
// one line "HEX  NAME" as sha256sum writes it (so `sha256sum -c` checks it).
const ChecksumSuffix = ".sha256"

// BackupResult describes a backup written by [Backup].
type BackupResult struct {
	// Path is the backup file.
	Path string
	// Size is its size in bytes (etcd's database, and the 32-byte sha256
	// of it that etcd appends).
	Size int64
	// SHA256 is the hex sha256 of the whole file, as written to
	// Path+ChecksumSuffix.
	SHA256 string
	// Revision is the store's revision in the snapshot: every write
	// acknowledged at or before it is in the backup.
	Revision int64
	// Version is the storage version of the etcd that sent it.
	Version string
	// Took is how long the backup took.
	Took time.Duration
}

// ErrBackupExists is matched by the error of Backup when its file exists.
var ErrBackupExists = errors.New("cluster: backup file exists")

// Backup streams a snapshot of etcd's database from a member that cli
// reaches (etcd's maintenance Snapshot: the member's state at one point in
// time, taken while it keeps serving) into path. It writes path.part,
// created exclusively, checks etcd's own trailing sha256 of the data,
// fsyncs it and links it to path (a hard link, which never replaces a file
// there), then writes the file's sha256 to path+ChecksumSuffix. progress,
// when not nil, is called with the bytes written so far as they arrive.
//
// Backup refuses, with an error matching ErrBackupExists, a path that
// exists, a path.part that exists (another backup to path is running, or
// one was interrupted: remove it then) and a path that appears while it
// runs. On any error it leaves neither path.part nor, unless it was there
// before, path.
func Backup(ctx context.Context, cli *clientv3.Client, path string, progress func(written int64)) (BackupResult, error) {
	started := time.Now()
	res := BackupResult{Path: path}
	if _, err := os.Lstat(path); err == nil {
		return res, fmt.Errorf("%w: %s: choose another file name, or move it away first", ErrBackupExists, path)
	}
	part := path + ".part"
	// O_EXCL: of two backups to one file, the second fails here rather
	// than write into the first one's .part.
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return res, fmt.Errorf("%w: %s exists: another backup to %s is running, or one was interrupted; wait for it, or remove %s if none runs, then back up again",
			ErrBackupExists, part, path, part)
	}
	if err != nil {
		return res, fmt.Errorf("cluster: backup: create %s: %w", part, err)
	}
	ours := true // part is this backup's (O_EXCL) until renamed away
	defer func() {
		if ours {
			_ = os.Remove(part)
		}
	}()
	whole, err := receiveSnapshot(ctx, cli, f, part, progress, &res)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("cluster: backup: close %s: %w", part, cerr)
	}
	if err != nil {
		return res, err
	}
	if res.Revision, err = SnapshotRevision(part); err != nil {
		return res, err
	}
	renamed, err := publish(part, path)
	ours = !renamed
	if err != nil {
		return res, err
	}
	res.SHA256 = hex.EncodeToString(whole)
	line := res.SHA256 + "  " + filepath.Base(path) + "\n"
	if err := writeFileSync(path+ChecksumSuffix, []byte(line)); err != nil {
		// A backup without its checksum is refused by restore, and a
		// rerun would find path taken: leave neither.
		_ = os.Remove(path)
		return res, fmt.Errorf("cluster: backup: write the checksum %s (the backup was removed again; fix the cause and back up again): %w", path+ChecksumSuffix, err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return res, fmt.Errorf("cluster: backup: %w", err)
	}
	res.Took = time.Since(started)
	return res, nil
}

// receiveSnapshot streams a snapshot from cli into f (named part), checks
// the sha256 etcd appends to it and fsyncs f. It sets res's Size and
// Version and returns the sha256 of the whole file.
func receiveSnapshot(ctx context.Context, cli *clientv3.Client, f *os.File, part string, progress func(int64), res *BackupResult) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	snap, err := cli.SnapshotWithVersion(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: backup: ask etcd for a snapshot: %w", err)
	}
	defer snap.Snapshot.Close()
	res.Version = snap.Version
	whole, data := sha256.New(), &tailHash{h: sha256.New()}
	w := &countingWriter{w: io.MultiWriter(f, whole, data), progress: progress}
	if _, err := io.Copy(w, snap.Snapshot); err != nil {
		return nil, fmt.Errorf("cluster: backup: receive the snapshot (%d bytes so far): %w", w.n, err)
	}
	res.Size = w.n
	if !data.matches() {
		return nil, fmt.Errorf("cluster: backup: the snapshot received (%d bytes) does not end with the sha256 of its data: it is incomplete or damaged; back up again", w.n)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("cluster: backup: sync %s: %w", part, err)
	}
	return whole.Sum(nil), nil
}

// publish makes the finished part the file path without ever replacing a
// file at path: a hard link, which fails when path exists, so that the
// check and the creation are one step; the caller then removes part. On a
// file system without hard links (FAT, some network file systems) it
// checks that path is free and renames part to it, two steps, and reports
// that it renamed it.
func publish(part, path string) (renamed bool, err error) {
	err = os.Link(part, path)
	if err != nil && !errors.Is(err, fs.ErrExist) && (errors.Is(err, errors.ErrUnsupported) || errors.Is(err, fs.ErrPermission)) {
		if _, lerr := os.Lstat(path); lerr == nil {
			err = fs.ErrExist
		} else if err = os.Rename(part, path); err == nil {
			renamed = true
		}
	}
	if errors.Is(err, fs.ErrExist) {
		return false, fmt.Errorf("%w: %s appeared while the backup ran (another backup, or another program, wrote it) and was left as it is: choose another file name and back up again",
			ErrBackupExists, path)
	}
	if err != nil {
		return false, fmt.Errorf("cluster: backup: link %s to %s: %w", part, path, err)
	}
	return renamed, nil
}

// countingWriter counts what goes through it and reports it.
type countingWriter struct {
	w        io.Writer
	n        int64
	progress func(int64)
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if c.progress != nil {
		c.progress(c.n)
	}
	return n, err
}

// tailHash hashes all it is given but the last sha256.Size bytes, which it
// keeps: etcd's snapshot stream ends with the sha256 of the data before it.
type tailHash struct {
	h    hash.Hash
	tail []byte
	n    int64
}

func (t *tailHash) Write(p []byte) (int, error) {
	t.n += int64(len(p))
	t.tail = append(t.tail, p...)
	if cut := len(t.tail) - sha256.Size; cut > 0 {
		t.h.Write(t.tail[:cut])
		t.tail = append(t.tail[:0], t.tail[cut:]...)
	}
	return len(p), nil
}

// matches reports whether the data ends with its own sha256, with the data
// a whole number of 512-byte sectors long as etcd sends it.
func (t *tailHash) matches() bool {
	return t.n%512 == sha256.Size && len(t.tail) == sha256.Size && bytes.Equal(t.h.Sum(nil), t.tail)
}

// SnapshotRevision returns the store revision of an etcd snapshot file (or
// database): the highest revision written in it, or compacted to.
func SnapshotRevision(path string) (int64, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return 0, fmt.Errorf("cluster: open the snapshot %s: %w", path, err)
	}
	defer db.Close()
	var rev int64
	err = db.View(func(tx *bolt.Tx) error {
		keys := tx.Bucket([]byte("key"))
		if keys == nil {
			return errors.New("it has no key bucket: it is not an etcd snapshot")
		}
		if k, _ := keys.Cursor().Last(); len(k) >= 17 {
			rev = mvcc.BytesToRev(k).Main
		}
		if meta := tx.Bucket([]byte("meta")); meta != nil {
			if v := meta.Get([]byte("finishedCompactRev")); len(v) >= 17 {
				rev = max(rev, mvcc.BytesToRev(v).Main)
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("cluster: read the snapshot %s: %w", path, err)
	}
	return rev, nil
}

// writeFileSync writes data to path and fsyncs it. When a write or the
// sync fails, it removes the file it opened.
func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
	}
	return err
}

// syncDir fsyncs a directory, so that renames and new files in it last.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
