package paxos

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// walFiles returns the names of the acceptor log files in dir.
func walFiles(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		if strings.HasPrefix(de.Name(), walPrefix) {
			names = append(names, de.Name())
		}
	}
	return names
}

// walWritten writes a promise, ten entries and a commit index to a new
// storage in dir, closes it and returns the state it must reopen with.
func walWritten(t *testing.T, dir string) State {
	t.Helper()
	s, _, err := OpenStorage(dir, "g", 1, storTestPeers)
	if err != nil {
		t.Fatal(err)
	}
	b := Ballot{Round: 2, Node: 1}
	if err := s.SetPromised(Ballot{Round: 1}); err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < 5; i++ {
		if err := s.Accept(b, storTestEntries(2*i+1, 2*i+2, b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetCommit(7); err != nil { // synced by Close
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return State{Promised: b, Commit: 7, Entries: storTestEntries(1, 10, b), Members: storTestPeers}
}

// TestStorageLogTornTail: what a crash can leave after the last synced
// record (part of a header, a record running past the end, a last record
// whose checksum fails, zeros) is cut off on open; the state is what was
// synced, and writes after it survive the next reopen.
func TestStorageLogTornTail(t *testing.T) {
	rec := walAppendRecord(nil, Ballot{Round: 9}, 99, [][]byte{[]byte(`{"s":11}`)})
	badSum := bytes.Clone(rec)
	badSum[len(badSum)-1] ^= 0xff
	for name, tail := range map[string][]byte{
		"part of a header":           rec[:5],
		"record past the end":        rec[:len(rec)-3],
		"last record damaged":        badSum,
		"zeros of an unsynced write": make([]byte, 4096),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			want := walWritten(t, dir)
			path := filepath.Join(dir, walFiles(t, dir)[0])
			synced, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, append(bytes.Clone(synced), tail...), 0o600); err != nil {
				t.Fatal(err)
			}
			s, st := storOpenTest(t, dir)
			if !reflect.DeepEqual(st, want) {
				t.Fatalf("state =\n%+v\nwant\n%+v", st, want)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, synced) {
				t.Fatalf("log is %d bytes after open, want the %d synced", len(got), len(synced))
			}
			b := want.Promised
			if err := s.Accept(b, storTestEntries(11, 11, b)); err != nil {
				t.Fatal(err)
			}
			s.Close()
			_, st = storOpenTest(t, dir)
			if want.Entries = storTestEntries(1, 11, b); !reflect.DeepEqual(st, want) {
				t.Fatalf("state after a write past the cut =\n%+v\nwant\n%+v", st, want)
			}
		})
	}
}

// TestStorageLogDamageRefused: a damaged record with records after it is
// a lost synced write: the open is refused, says what to do, and changes
// nothing.
func TestStorageLogDamageRefused(t *testing.T) {
	dir := t.TempDir()
	walWritten(t, dir)
	path := filepath.Join(dir, walFiles(t, dir)[0])
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x01
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s, _, err := OpenStorage(dir, "g", 1, storTestPeers)
	if err == nil {
		s.Close()
		t.Fatal("OpenStorage accepted a log damaged in the middle")
	}
	if !strings.Contains(err.Error(), "move the data dir away") {
		t.Errorf("error %q does not say what to do", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, data) {
		t.Error("the refused log was changed")
	}
}

// TestStorageSnapshotStartsGeneration: a snapshot leaves one log file, a
// newer generation holding only what is above the snapshot; a crash
// before the older generation was removed, or before the newer one was
// renamed into place, reopens to the same state.
func TestStorageSnapshotStartsGeneration(t *testing.T) {
	dir := t.TempDir()
	want := walWritten(t, dir)
	before := walFiles(t, dir)
	old, err := os.ReadFile(filepath.Join(dir, before[0]))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := storOpenTest(t, dir)
	snap := Snapshot{Index: 6, Members: storTestPeers, Data: []byte(`{}`)}
	if err := s.SaveSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	after := walFiles(t, dir)
	if len(after) != 1 || after[0] <= before[0] {
		t.Fatalf("log files after a snapshot: %v (before: %v), want one newer", after, before)
	}
	s.Close()
	want.Entries, want.Snapshot = storTestEntries(7, 10, want.Promised), &snap
	// The older generation still there, and a newer one never renamed.
	for _, f := range []struct{ name, data string }{{before[0], string(old)}, {walName(99) + walTemp, "torn"}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, st := storOpenTest(t, dir)
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("state =\n%+v\nwant\n%+v", st, want)
	}
	if got := walFiles(t, dir); !reflect.DeepEqual(got, after) {
		t.Fatalf("log files after reopen: %v, want %v", got, after)
	}
}

// TestStorageSnapshotBeforeNewGeneration: a crash after the snapshot was
// saved but before the next generation was written leaves the older log,
// whose entries at or below the snapshot are dropped on open.
func TestStorageSnapshotBeforeNewGeneration(t *testing.T) {
	dir := t.TempDir()
	want := walWritten(t, dir)
	name := walFiles(t, dir)[0]
	old, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := storOpenTest(t, dir)
	snap := Snapshot{Index: 8, Members: storTestPeers, Data: []byte(`{}`)}
	if err := s.SaveSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	s.Close()
	for _, f := range walFiles(t, dir) {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, name), old, 0o600); err != nil {
		t.Fatal(err)
	}
	_, st := storOpenTest(t, dir)
	want.Commit, want.Entries, want.Snapshot = 8, storTestEntries(9, 10, want.Promised), &snap
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("state =\n%+v\nwant\n%+v", st, want)
	}
}

// TestStorageRefusesMissingLog: a dir with a snapshot but no log, and a
// log without its bbolt file, are refused; nothing is created.
func TestStorageRefusesMissingLog(t *testing.T) {
	t.Run("log missing", func(t *testing.T) {
		dir := t.TempDir()
		walWritten(t, dir)
		s, _ := storOpenTest(t, dir)
		if err := s.SaveSnapshot(Snapshot{Index: 3, Members: storTestPeers}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		for _, f := range walFiles(t, dir) {
			os.Remove(filepath.Join(dir, f))
		}
		if s, _, err := OpenStorage(dir, "g", 1, storTestPeers); err == nil || !strings.Contains(err.Error(), "missing") {
			if s != nil {
				s.Close()
			}
			t.Fatalf("open without the log: %v, want refused", err)
		}
		if f := walFiles(t, dir); len(f) != 0 {
			t.Fatalf("refused open created %v", f)
		}
	})
	t.Run("bbolt file missing", func(t *testing.T) {
		dir := t.TempDir()
		walWritten(t, dir)
		if err := os.Remove(filepath.Join(dir, storFile)); err != nil {
			t.Fatal(err)
		}
		if s, _, err := OpenStorage(dir, "g", 1, storTestPeers); err == nil || !strings.Contains(err.Error(), "restore "+storFile) {
			if s != nil {
				s.Close()
			}
			t.Fatalf("open without %s: %v, want refused", storFile, err)
		}
	})
}

// TestStorageMovesEarlierLayout: a dir whose acceptor state bbolt kept
// (format 1) opens with that state, moved to the log: the bbolt file is
// then of the current format without the state, and a second open gives
// the same.
func TestStorageMovesEarlierLayout(t *testing.T) {
	dir := t.TempDir()
	b := Ballot{Round: 4, Node: 2}
	snap := Snapshot{Index: 2, Members: storTestPeers, Data: []byte(`{"t":1}`)}
	storWriteFormat1(t, filepath.Join(dir, storFile), b, 3, storTestEntries(1, 5, b), snap)
	want := State{Promised: b, Commit: 3, Entries: storTestEntries(3, 5, b), Snapshot: &snap, Members: storTestPeers}
	for i := range 2 {
		s, st := storOpenTest(t, dir)
		if !reflect.DeepEqual(st, want) {
			t.Fatalf("open %d: state =\n%+v\nwant\n%+v", i+1, st, want)
		}
		s.Close()
	}
	db, err := bolt.Open(filepath.Join(dir, storFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(storBucketMeta)
		if f, _ := storGetU64(meta.Get(storKeyFormat)); f != storFormat {
			t.Errorf("format %d after the move, want %d", f, storFormat)
		}
		if tx.Bucket(storBucketEntries) != nil || meta.Get(storKeyPromised) != nil {
			t.Error("the acceptor state is still in bbolt after the move")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// storWriteFormat1 writes a bbolt file of the earlier layout, which kept
// the promise, the commit index and the entries in bbolt.
func storWriteFormat1(t *testing.T, path string, promised Ballot, commit uint64, es []Entry, snap Snapshot) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	members, _ := json.Marshal(storTestPeers)
	snapMembers, _ := json.Marshal(snap.Members)
	err = db.Update(func(tx *bolt.Tx) error {
		meta, _ := tx.CreateBucket(storBucketMeta)
		ents, _ := tx.CreateBucket(storBucketEntries)
		sb, _ := tx.CreateBucket(storBucketSnapshot)
		for _, kv := range [][2][]byte{
			{storKeyFormat, storU64(storFormatBolt)}, {storKeyGroup, []byte("g")}, {storKeyID, storU64(1)},
			{storKeyMembers, members}, {storKeyPromised, storBallot(promised)}, {storKeyCommit, storU64(commit)},
		} {
			if err := meta.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		for _, e := range es {
			v, _ := json.Marshal(e)
			if err := ents.Put(storU64(e.Slot), v); err != nil {
				return err
			}
		}
		for _, kv := range [][2][]byte{{storKeyIndex, storU64(snap.Index)}, {storKeyMembers, snapMembers}, {storKeyData, snap.Data}} {
			if err := sb.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDataDirWithOnlyLogIsNotNew: a dir holding an acceptor log but no
// paxos.db is not new: it holds promises.
func TestDataDirWithOnlyLogIsNotNew(t *testing.T) {
	dir := t.TempDir()
	walWritten(t, dir)
	if err := os.Remove(filepath.Join(dir, storFile)); err != nil {
		t.Fatal(err)
	}
	if isNew, err := DataDirIsNew(dir); err != nil || isNew {
		t.Fatalf("DataDirIsNew(a dir with only a log) = %v, %v, want false", isNew, err)
	}
	if isNew, err := DataDirIsNew(filepath.Join(dir, "absent")); err != nil || !isNew {
		t.Fatalf("DataDirIsNew(an absent dir) = %v, %v, want true", isNew, err)
	}
}
