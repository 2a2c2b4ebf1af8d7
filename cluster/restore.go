package cluster

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/droverhq/drover"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// DefaultRevisionBump is how far Restore moves the store's revision past
// the backup's, by default: more revisions than a cluster writes between a
// backup and its restore, so that revisions, and the fencing tokens drawn
// from them, never go back.
const DefaultRevisionBump = 1_000_000_000

// RestoreConfig configures [Restore]. Snapshot and DataDir are required.
type RestoreConfig struct {
	// Snapshot is the backup file, written by [Backup] (or etcdctl
	// snapshot save).
	Snapshot string
	// SHA256 is the hex sha256 the file must have; "" reads it from
	// Snapshot+ChecksumSuffix.
	SHA256 string
	// DataDir is the new member's data directory; it must not exist, or
	// be empty.
	DataDir string
	// Name is the member's name. Default "drover".
	Name string
	// PeerURL is the member's (advertised) peer URL. Default: Name's in
	// InitialCluster, else http://127.0.0.1:2380.
	PeerURL string
	// InitialCluster lists every member of the restored cluster as
	// NAME=PEER-URL pairs; default Name=PeerURL, a single member. Each
	// member of a cluster is restored from the same file with the same
	// InitialCluster and its own Name.
	InitialCluster string
	// RevisionBump is added to the store's revision, which is then marked
	// compacted (watchers from an older revision are told to re-read).
	// Zero means DefaultRevisionBump; negative keeps the backup's revision.
	RevisionBump int64
}

// RestoreResult describes a restore.
type RestoreResult struct {
	// Revision is the backup's store revision; Restored the restored
	// store's, as read back from the restored data dir (Revision plus the
	// bump).
	Revision, Restored int64
	// SHA256 is the backup file's checksum, as verified.
	SHA256 string
}

// ErrChecksumMismatch is matched by the error of Restore when the backup
// file's sha256 is not the one expected.
var ErrChecksumMismatch = errors.New("cluster: backup checksum mismatch")

// ChecksumError says which file did not match which checksum.
type ChecksumError struct {
	File, Want, Got, From string
}

// Error implements error.
func (e *ChecksumError) Error() string {
	return fmt.Sprintf("backup %s has sha256 %s, but %s says %s: the file is damaged or is not the backup that checksum belongs to; nothing was restored: restore another backup",
		e.File, e.Got, e.From, e.Want)
}

// Unwrap returns ErrChecksumMismatch.
func (e *ChecksumError) Unwrap() error { return ErrChecksumMismatch }

func (c RestoreConfig) withDefaults() RestoreConfig {
	if c.Name == "" {
		c.Name = DefaultMemberName
	}
	if c.PeerURL == "" && c.InitialCluster != "" {
		if members, err := ParseInitialCluster(c.InitialCluster); err == nil {
			c.PeerURL = members[c.Name]
		}
	}
	if c.PeerURL == "" {
		c.PeerURL = DefaultPeerURL
	}
	if c.InitialCluster == "" {
		c.InitialCluster = c.Name + "=" + c.PeerURL
	}
	if c.RevisionBump == 0 {
		c.RevisionBump = DefaultRevisionBump
	}
	return c
}

// Validate reports the first field that is not usable, as a
// drover.InputError naming it.
func (c RestoreConfig) Validate() error {
	c = c.withDefaults()
	bad := func(field string, v any, rule string) error {
		return &drover.InputError{Field: field, Value: v, Rule: rule}
	}
	switch {
	case c.Snapshot == "":
		return bad("Snapshot", c.Snapshot, "must name the backup file")
	case c.DataDir == "":
		return bad("DataDir", c.DataDir, "must name the new data directory")
	case !memberName(c.Name):
		return bad("Name", c.Name, "must be 1 to 64 letters, digits, '-', '_' or '.'")
	case !hostURL(c.PeerURL):
		return bad("PeerURL", c.PeerURL, "must be http(s)://HOST:PORT with no path")
	}
	if c.SHA256 != "" {
		if b, err := hex.DecodeString(c.SHA256); err != nil || len(b) != sha256.Size {
			return bad("SHA256", c.SHA256, "must be 64 hex digits")
		}
	}
	members, err := ParseInitialCluster(c.InitialCluster)
	if err != nil {
		return err
	}
	peer, ok := members[c.Name]
	if !ok {
		return bad("Name", c.Name, "must be one of the names in the initial cluster ("+strings.Join(sortedNames(members), ", ")+")")
	}
	if !sameURL(peer, c.PeerURL) {
		return bad("PeerURL", c.PeerURL, fmt.Sprintf("must be %s's peer URL in the initial cluster, %s", c.Name, peer))
	}
	return nil
}

// Restore makes a new member's data directory from a backup, with etcd's
// own restore (etcdutl's snapshot package): it verifies the file's sha256
// and etcd's checksum inside it before it opens the file, refuses a DataDir
// that holds anything, and writes the store with the cluster membership of
// cfg into a work directory, which it syncs and then moves into place in
// one rename: DataDir holds a member only once the restore is complete.
// On failure the work directory is removed; an interrupted restore (a
// crash) may leave it, and nothing in DataDir that a server starts on
// (Embed refuses to start while such a directory is there).
//
// The work directory is a sibling of DataDir, DataDir.restoring-RANDOM,
// renamed to DataDir, when DataDir does not exist. When DataDir exists (and
// is empty) it is DataDir/.restoring-RANDOM, whose member directory is
// renamed to DataDir/member: DataDir itself stays, with its owner and
// mode, and works when it is a mount point (which a rename onto it would
// not replace).
//
// Leases in the backup are restored with their keys: each runs its whole
// TTL again from the moment the restored cluster elects a leader, and
// expires then unless its holder renews it.
func Restore(cfg RestoreConfig) (RestoreResult, error) {
	var res RestoreResult
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	cfg = cfg.withDefaults()
	if err := emptyDir(cfg.DataDir); err != nil {
		return res, err
	}
	sum, err := verifyChecksum(cfg.Snapshot, cfg.SHA256)
	if err != nil {
		return res, err
	}
	res.SHA256 = sum
	// Opened as a database only now that both checksums passed.
	if res.Revision, err = SnapshotRevision(cfg.Snapshot); err != nil {
		return res, err
	}
	st, err := newStaging(cfg.DataDir)
	if err != nil {
		return res, err
	}
	rc := snapshot.RestoreConfig{
		SnapshotPath:   cfg.Snapshot,
		Name:           cfg.Name,
		OutputDataDir:  st.work,
		PeerURLs:       []string{cfg.PeerURL},
		InitialCluster: cfg.InitialCluster,
		// A token of its own (the same on every member restored from
		// this file): member and cluster ids derive from it, so a member
		// of the old cluster still running cannot join the new one.
		InitialClusterToken: "drover-restored-" + sum[:16],
	}
	if cfg.RevisionBump > 0 {
		rc.RevisionBump, rc.MarkCompacted = uint64(cfg.RevisionBump), true
	}
	res.Restored, err = st.restore(rc)
	switch {
	case err != nil && st.placed:
		return res, fmt.Errorf("cluster: restore %s into %s: the restored data is in place, but %w: check the file system, then start the server on it (or remove it and restore again)",
			cfg.Snapshot, cfg.DataDir, err)
	case err != nil:
		_ = os.RemoveAll(st.work)
		return res, fmt.Errorf("cluster: restore %s into %s: %w (nothing was restored into %s)", cfg.Snapshot, cfg.DataDir, err, cfg.DataDir)
	}
	return res, nil
}

// restoringInfix names a restore's work directory: DIR.restoring-RANDOM
// beside a data dir DIR, or DIR/.restoring-RANDOM inside it.
const restoringInfix = ".restoring-"

// staging is where a restore writes a data dir before it is moved into
// place.
type staging struct {
	dir    string // the data dir
	work   string // the directory etcd's restore writes
	inside bool   // work is inside dir, an existing empty directory
	placed bool   // the restored member is in dir
}

// newStaging makes the work directory of a restore into dir: inside dir
// when it exists, beside it when not.
func newStaging(dir string) (*staging, error) {
	dir = filepath.Clean(dir)
	st := &staging{dir: dir}
	parent, prefix := filepath.Dir(dir), filepath.Base(dir)+restoringInfix
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		st.inside, parent, prefix = true, dir, restoringInfix
	} else if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: restore: create %s, the data dir's parent: %w", parent, err)
	}
	work, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		return nil, fmt.Errorf("cluster: restore: create a work directory in %s: %w", parent, err)
	}
	st.work = work
	return st, nil
}

// restoreHooks, set by tests, holds a function per data directory that a
// restore into that directory calls once etcd's restore has written the
// work directory, before it is moved into place; an error it returns fails
// the restore there. Keyed by data directory, a test's hook never stops a
// restore of another test running beside it.
var restoreHooks sync.Map // data dir -> func(dataDir, work string) error

// restore runs etcd's restore into the work directory, reads the restored
// store's revision back from it, syncs it and moves it into place.
func (st *staging) restore(rc snapshot.RestoreConfig) (int64, error) {
	if err := snapshot.NewV3(zap.NewNop()).Restore(rc); err != nil {
		return 0, err
	}
	rev, err := SnapshotRevision(filepath.Join(st.work, "member", "snap", "db"))
	if err != nil {
		return 0, fmt.Errorf("read the restored store's revision: %w", err)
	}
	if h, ok := restoreHooks.Load(filepath.Clean(st.dir)); ok {
		if err := h.(func(dataDir, work string) error)(st.dir, st.work); err != nil {
			return 0, err
		}
	}
	if err := syncTree(st.work); err != nil {
		return 0, err
	}
	if !st.inside {
		// os.Rename refuses a directory that appeared at dir meanwhile.
		if err := os.Rename(st.work, st.dir); err != nil {
			return 0, fmt.Errorf("move the restored data dir into place (did %s appear meanwhile? then restore into a new directory): %w", st.dir, err)
		}
		st.placed = true
		return rev, syncDir(filepath.Dir(st.dir))
	}
	// The rename of member is what makes dir a member's data dir; it fails
	// if a member directory appeared there meanwhile.
	if err := os.Rename(filepath.Join(st.work, "member"), filepath.Join(st.dir, "member")); err != nil {
		return 0, fmt.Errorf("move the restored member into %s (did a server start on it meanwhile? then restore into a new directory): %w", st.dir, err)
	}
	st.placed = true
	// Empty now; one left behind is harmless: a server starts on a data
	// dir that holds a member whatever else is there.
	_ = os.Remove(st.work)
	return rev, syncDir(st.dir)
}

// syncTree fsyncs every file and directory under root, root included, so
// that a restored data dir is on disk before it is moved into place.
func syncTree(root string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", path, err)
		}
		return nil
	})
}

// restoreLeftovers lists the work directories of interrupted restores
// into dir: DIR.restoring-* beside it and DIR/.restoring-* inside it.
func restoreLeftovers(dir string) []string {
	dir = filepath.Clean(dir)
	var out []string
	for _, place := range []struct{ dir, prefix string }{
		{filepath.Dir(dir), filepath.Base(dir) + restoringInfix},
		{dir, restoringInfix},
	} {
		entries, err := os.ReadDir(place.dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), place.prefix) {
				out = append(out, filepath.Join(place.dir, e.Name()))
			}
		}
	}
	return out
}

// emptyDir returns nil when dir does not exist or is an empty directory.
func emptyDir(dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cluster: restore: open the data dir: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(2)
	if err != nil && !errors.Is(err, io.EOF) {
		return &drover.InputError{Field: "DataDir", Value: dir, Rule: "must be a new or empty directory: " + err.Error()}
	}
	if len(names) == 1 && strings.HasPrefix(names[0], restoringInfix) {
		return &drover.InputError{Field: "DataDir", Value: dir, Rule: "must be a new or empty directory, and this one holds " + names[0] +
			", the work directory of an interrupted restore (or of one still running): once none runs, remove it and restore again"}
	}
	if len(names) > 0 {
		return &drover.InputError{Field: "DataDir", Value: dir, Rule: "must be a new or empty directory, and this one holds files: " +
			"restore into a new directory, then start the server on it (an existing member's data is never overwritten)"}
	}
	return nil
}

// verifyChecksum checks the sha256 of file against want, or when want is
// empty against file+ChecksumSuffix, and returns it.
func verifyChecksum(file, want string) (string, error) {
	from := "--sha256"
	if want == "" {
		from = file + ChecksumSuffix
		w, err := readChecksumFile(from)
		if err != nil {
			return "", err
		}
		want = w
	}
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("cluster: restore: open the backup: %w", err)
	}
	defer f.Close()
	h, data := sha256.New(), &tailHash{h: sha256.New()}
	if _, err := io.Copy(io.MultiWriter(h, data), bufio.NewReaderSize(f, 1<<20)); err != nil {
		return "", fmt.Errorf("cluster: restore: read the backup %s: %w", file, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if !strings.EqualFold(got, want) {
		return "", &ChecksumError{File: file, Want: strings.ToLower(want), Got: got, From: from}
	}
	// etcd's own checksum too, before the file is opened as a database:
	// a snapshot ends with the sha256 of its data.
	if !data.matches() {
		return "", fmt.Errorf("%w: %s does not end with the sha256 of its data, as an etcd snapshot does: it is not a complete snapshot; nothing was restored: restore another backup", ErrChecksumMismatch, file)
	}
	return got, nil
}

// ErrNoChecksum is matched by the error of Restore when the backup has no
// checksum file and none was given.
var ErrNoChecksum = errors.New("cluster: no checksum for the backup")

// readChecksumFile reads the first field of a sha256sum line.
func readChecksumFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%w: %s does not exist: keep it beside the backup, or give the checksum (drover backup --json prints it)", ErrNoChecksum, path)
	}
	if err != nil {
		return "", fmt.Errorf("cluster: restore: read the checksum: %w", err)
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return "", fmt.Errorf("%w: %s is empty", ErrNoChecksum, path)
	}
	if d, err := hex.DecodeString(fields[0]); err != nil || len(d) != sha256.Size {
		return "", fmt.Errorf("%w: %s does not start with a sha256 (64 hex digits)", ErrNoChecksum, path)
	}
	return fields[0], nil
}
