package paxos

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
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
		"header never written back":  append(make([]byte, walHeader), rec[walHeader:]...),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			want := walWritten(t, dir)
			path := filepath.Join(dir, walFiles(t, dir)[0])
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// The records, then the zeros written ahead of them: the
			// crash left tail over the first of the zeros.
			_, good, err := walReplay(data)
			if err != nil || good == len(data) {
				t.Fatalf("replay: %d of %d bytes whole, %v; want records, then zeros", good, len(data), err)
			}
			synced := bytes.Clone(data[:good])
			if name == "record past the end" || name == "zeros of an unsynced write" {
				// The file grew: the tail runs past the zeros' end (a
				// kept zero tail this short is extended on open).
				data = append(data[:good:good], tail...)
			} else {
				copy(data[good:], tail)
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			s, st := storOpenTest(t, dir)
			if !reflect.DeepEqual(st, want) {
				t.Fatalf("state =\n%+v\nwant\n%+v", st, want)
			}
			got, _ := os.ReadFile(path)
			if len(got) < len(synced) || !bytes.Equal(got[:len(synced)], synced) || len(bytes.TrimLeft(got[len(synced):], "\x00")) > 0 {
				t.Fatalf("log after open: want the %d bytes synced, then only zeros (of %d)", len(synced), len(got))
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
	_, good, err := walReplay(data)
	if err != nil {
		t.Fatal(err)
	}
	data[good/2] ^= 0x01 // in the records, not in the zeros after them
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
		for i := range 2 { // the refusal writes nothing, so it holds on the next try
			if s, _, err := OpenStorage(dir, "other", 9, nil); err == nil || !strings.Contains(err.Error(), "restore "+storFile) {
				if s != nil {
					s.Close()
				}
				t.Fatalf("open %d without %s: %v, want refused", i+1, storFile, err)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, storFile)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a refused open created %s: %v", storFile, err)
		}
	})
	t.Run("log missing before any snapshot", func(t *testing.T) {
		dir := t.TempDir()
		walWritten(t, dir)
		for _, f := range walFiles(t, dir) {
			os.Remove(filepath.Join(dir, f))
		}
		if s, _, err := OpenStorage(dir, "g", 1, storTestPeers); err == nil || !strings.Contains(err.Error(), "missing") {
			if s != nil {
				s.Close()
			}
			t.Fatalf("open without the log: %v, want refused", err)
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

// TestStorageLogLengthDamageRefused: a record whose length was damaged
// (here made to run past the end of the file) with whole records after it
// is damage, not a torn tail: the open is refused rather than cutting the
// synced records after it.
func TestStorageLogLengthDamageRefused(t *testing.T) {
	dir := t.TempDir()
	walWritten(t, dir)
	s, _ := storOpenTest(t, dir)
	path := filepath.Join(dir, walName(s.gen))
	mid := s.log.end // where the next record goes (zeros follow)
	for _, r := range []uint64{50, 60} {
		if err := s.SetPromised(Ballot{Round: r, Node: 2}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint32(data[mid:], binary.BigEndian.Uint32(data[mid:])|1<<22) // past the 2 MB of zeros
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, st, err := OpenStorage(dir, "g", 1, storTestPeers); err == nil {
		s.Close()
		t.Fatalf("open with a damaged length succeeded with promise %v (60 was synced)", st.Promised)
	}
}

// TestStorageCommitWrittenWithNextRecord: SetCommit appends nothing; the
// next synced record carries the commit index (so a crash can damage only
// the one record being written).
func TestStorageCommitWrittenWithNextRecord(t *testing.T) {
	dir := t.TempDir()
	s, _ := storOpenTest(t, dir)
	path := filepath.Join(dir, walName(s.gen))
	size := func() int64 { // the records' end: zeros follow them
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, good, err := walReplay(data)
		if err != nil {
			t.Fatal(err)
		}
		return int64(good)
	}
	before := size()
	if err := s.SetCommit(4); err != nil {
		t.Fatal(err)
	}
	if got := size(); got != before {
		t.Fatalf("SetCommit wrote %d bytes", got-before)
	}
	b := Ballot{Round: 1, Node: 1}
	if err := s.Accept(b, storTestEntries(1, 4, b)); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := walReplay(data) // without Close
	if err != nil || st.commit != 4 {
		t.Fatalf("log after the acceptance: commit %d, %v; want 4", st.commit, err)
	}
}

// TestStorageFailedSnapshotStopsWrites: when the log's next generation
// cannot be written after a snapshot was saved, the storage takes no more
// writes (the new generation might be in place and replace the current
// one on the next open).
func TestStorageFailedSnapshotStopsWrites(t *testing.T) {
	dir := t.TempDir()
	walWritten(t, dir)
	s, _ := storOpenTest(t, dir)
	// A directory where the new generation's temporary file goes.
	if err := os.Mkdir(filepath.Join(dir, walName(s.gen+1)+walTemp), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveSnapshot(Snapshot{Index: 3, Members: storTestPeers}); err == nil {
		t.Fatal("SaveSnapshot succeeded without its log generation")
	}
	if err := s.SetPromised(Ballot{Round: 99}); err == nil || !strings.Contains(err.Error(), "earlier write failed") {
		t.Fatalf("write after the failed snapshot: %v, want refused", err)
	}
}
