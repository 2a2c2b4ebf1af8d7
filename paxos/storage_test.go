package paxos

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

var storTestPeers = []Peer{{ID: 0, Addr: "127.0.0.1:7100"}, {ID: 1, Addr: "127.0.0.1:7101"}, {ID: 2, Addr: "127.0.0.1:7102"}}

// storOpenTest opens storage in dir for group "g", node 1.
func storOpenTest(t *testing.T, dir string) (*Storage, State) {
	t.Helper()
	s, st, err := OpenStorage(dir, "g", 1, storTestPeers)
	if err != nil {
		t.Fatalf("OpenStorage(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, st
}

// storTestEntries returns entries for slots from..to at ballot b.
func storTestEntries(from, to uint64, b Ballot) []Entry {
	var es []Entry
	for s := from; s <= to; s++ {
		es = append(es, Entry{Slot: s, Ballot: b, Cmd: Command{
			Op: OpAcquire, ID: fmt.Sprintf("c%d", s), Time: int64(1000 + s), Lock: fmt.Sprintf("l%d", s%3),
			Owner: "o", TTL: 5000, Meta: `{"host":"a"}`,
		}})
	}
	return es
}

func TestStorageFreshAndReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "data")
	s, st := storOpenTest(t, dir)
	want := State{Members: storTestPeers}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("fresh state = %+v, want %+v", st, want)
	}
	b := Ballot{Round: 3, Node: 2}
	if err := s.SetPromised(b); err != nil {
		t.Fatal(err)
	}
	if err := s.Accept(b, storTestEntries(1, 5, b)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetCommit(4); err != nil {
		t.Fatal(err)
	}
	// A lower promise and a lower commit change nothing.
	if err := s.SetPromised(Ballot{Round: 2, Node: 9}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetCommit(2); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Peers given at reopen are ignored: the recorded members come back.
	s2, st2, err := OpenStorage(dir, "g", 1, []Peer{{ID: 7}})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	want = State{Promised: b, Commit: 4, Entries: storTestEntries(1, 5, b), Members: storTestPeers}
	if !reflect.DeepEqual(st2, want) {
		t.Fatalf("reopened state =\n%+v\nwant\n%+v", st2, want)
	}
}

func TestStorageAcceptOverwritesSlot(t *testing.T) {
	dir := t.TempDir()
	s, _ := storOpenTest(t, dir)
	low, high := Ballot{Round: 1, Node: 0}, Ballot{Round: 2, Node: 1}
	if err := s.Accept(low, storTestEntries(1, 3, low)); err != nil {
		t.Fatal(err)
	}
	over := Entry{Slot: 2, Ballot: high, Cmd: Command{Op: OpNoop}}
	if err := s.Accept(high, []Entry{over}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, st := storOpenTest(t, dir)
	if st.Promised != high {
		t.Fatalf("promised = %v, want %v", st.Promised, high)
	}
	want := storTestEntries(1, 3, low)
	want[1] = over
	if !reflect.DeepEqual(st.Entries, want) {
		t.Fatalf("entries = %+v, want %+v", st.Entries, want)
	}
}

func TestStorageSnapshotTruncates(t *testing.T) {
	dir := t.TempDir()
	s, _ := storOpenTest(t, dir)
	b := Ballot{Round: 1, Node: 1}
	if err := s.Accept(b, storTestEntries(1, 10, b)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetCommit(5); err != nil {
		t.Fatal(err)
	}
	snap := Snapshot{Index: 6, Members: storTestPeers[:2], Data: []byte(`{"table":1}`)}
	if err := s.SaveSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	// An entry at or below the snapshot is covered by it and not stored.
	if err := s.Accept(b, storTestEntries(3, 3, b)); err != nil {
		t.Fatal(err)
	}
	// An older snapshot is refused.
	if err := s.SaveSnapshot(Snapshot{Index: 5}); !errors.Is(err, errSnapshotOlder) {
		t.Fatalf("SaveSnapshot below the stored index: %v, want errSnapshotOlder", err)
	}
	s.Close()
	_, st := storOpenTest(t, dir)
	want := State{Promised: b, Commit: 6, Entries: storTestEntries(7, 10, b), Snapshot: &snap, Members: storTestPeers}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("state after snapshot =\n%+v\nwant\n%+v", st, want)
	}
}

// TestStorageSnapshotWhileAccepting saves snapshots on another goroutine,
// as the node does, while entries are accepted one write at a time: after
// a reopen the last snapshot and every entry above it are there.
func TestStorageSnapshotWhileAccepting(t *testing.T) {
	dir := t.TempDir()
	s, _ := storOpenTest(t, dir)
	b := Ballot{Round: 2, Node: 1}
	data := bytes.Repeat([]byte("x"), 1<<20) // a large table: its write takes a while
	snaps := make(chan uint64, 16)
	saved := make(chan error, 1)
	go func() {
		var err error
		for idx := range snaps {
			if err == nil {
				err = s.SaveSnapshot(Snapshot{Index: idx, Members: storTestPeers, Data: data})
			}
		}
		saved <- err
	}()
	const last = 600
	for slot := uint64(1); slot <= last; slot++ {
		if err := s.Accept(b, storTestEntries(slot, slot, b)); err != nil {
			t.Fatal(err)
		}
		if slot%100 == 0 {
			snaps <- slot - 50
		}
	}
	close(snaps)
	if err := <-saved; err != nil {
		t.Fatal(err)
	}
	// One older than the stored one, as a background save that lost the
	// race to an installed snapshot: refused, nothing changed.
	if err := s.SaveSnapshot(Snapshot{Index: 100, Members: storTestPeers, Data: data}); !errors.Is(err, errSnapshotOlder) {
		t.Fatalf("older snapshot: %v, want errSnapshotOlder", err)
	}
	s.Close()
	_, st := storOpenTest(t, dir)
	if st.Snapshot == nil || st.Snapshot.Index != last-50 || !bytes.Equal(st.Snapshot.Data, data) {
		t.Fatalf("snapshot after reopen: %+v, want index %d", st.Snapshot != nil, last-50)
	}
	if want := storTestEntries(last-49, last, b); !reflect.DeepEqual(st.Entries, want) {
		t.Fatalf("entries after reopen: %d (first %v), want slots %d..%d", len(st.Entries), st.Entries[:min(1, len(st.Entries))], last-49, last)
	}
}

// storFingerprint is what must not change when a dir is refused.
func storFingerprint(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x/%d/%d", b, info.Size(), info.ModTime().UnixNano())
}

func TestStorageRefusesOtherGroupOrID(t *testing.T) {
	dir := t.TempDir()
	s, _ := storOpenTest(t, dir)
	b := Ballot{Round: 1, Node: 1}
	if err := s.Accept(b, storTestEntries(1, 2, b)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	path := filepath.Join(dir, storFile)
	tests := []struct {
		name  string
		group string
		id    NodeID
	}{
		{name: "other group", group: "other", id: 1},
		{name: "other id", group: "g", id: 2},
		{name: "other group and id", group: "other", id: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := storFingerprint(t, path)
			entries, _ := os.ReadDir(dir)
			s, _, err := OpenStorage(dir, tc.group, tc.id, nil)
			if err == nil {
				s.Close()
				t.Fatal("OpenStorage succeeded on another node's dir")
			}
			if !errors.Is(err, ErrWrongGroup) {
				t.Fatalf("error %v does not match ErrWrongGroup", err)
			}
			var wg *WrongGroupError
			if !errors.As(err, &wg) || wg.Group != "g" || wg.ID != 1 || wg.WantGroup != tc.group || wg.WantID != tc.id {
				t.Fatalf("error = %#v, want the dir's group g node 1", err)
			}
			for _, part := range []string{`group "g" node 1`, "data dir of its own"} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error %q does not say %q", err, part)
				}
			}
			if after := storFingerprint(t, path); after != before {
				t.Error("refused open changed the db file")
			}
			if after, _ := os.ReadDir(dir); len(after) != len(entries) {
				t.Errorf("refused open created files: %v", after)
			}
		})
	}
	// The rightful node still opens it, state intact.
	_, st := storOpenTest(t, dir)
	if len(st.Entries) != 2 {
		t.Fatalf("entries after refusals = %d, want 2", len(st.Entries))
	}
}

func TestStorageInUse(t *testing.T) {
	dir := t.TempDir()
	storOpenTest(t, dir)
	start := time.Now()
	s, _, err := OpenStorage(dir, "g", 1, storTestPeers)
	if err == nil {
		s.Close()
		t.Fatal("second OpenStorage on an open dir succeeded")
	}
	if !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("error %v does not match ErrDataDirInUse", err)
	}
	if d := time.Since(start); d > 5*storOpenTimeout {
		t.Fatalf("refusal took %v", d)
	}
}

func TestStorageTornFileIsFresh(t *testing.T) {
	tests := []struct {
		name  string
		write func(t *testing.T, path string)
	}{
		{name: "empty file", write: func(t *testing.T, path string) {
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "partial first pages", write: func(t *testing.T, path string) {
			if err := os.WriteFile(path, bytes.Repeat([]byte{0xa5}, 1000), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "bbolt file without our state", write: func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			db.Close()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.write(t, filepath.Join(dir, storFile))
			s, st := storOpenTest(t, dir)
			if !reflect.DeepEqual(st, State{Members: storTestPeers}) {
				t.Fatalf("state = %+v, want fresh", st)
			}
			if err := s.SetPromised(Ballot{Round: 1}); err != nil {
				t.Fatalf("write after fresh start: %v", err)
			}
		})
	}
}

func TestStorageRefusesCorruptFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, storFile)
	junk := bytes.Repeat([]byte{0xa5}, 64*os.Getpagesize())
	if err := os.WriteFile(path, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	s, _, err := OpenStorage(dir, "g", 1, storTestPeers)
	if err == nil {
		s.Close()
		t.Fatal("OpenStorage accepted a corrupt file")
	}
	if !strings.Contains(err.Error(), "move the data dir away") {
		t.Errorf("error %q does not say what to do", err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, junk) {
		t.Error("refused corrupt file was changed")
	}
}

func TestStorageRefusesMissingDirOrGroup(t *testing.T) {
	tests := []struct {
		name, dir, group string
	}{
		{name: "no dir", dir: "", group: "g"},
		{name: "no group", dir: t.TempDir(), group: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, err := OpenStorage(tc.dir, tc.group, 1, storTestPeers)
			if err == nil {
				s.Close()
				t.Fatal("OpenStorage succeeded")
			}
			if tc.dir != "" {
				if _, statErr := os.Stat(filepath.Join(tc.dir, storFile)); !os.IsNotExist(statErr) {
					t.Fatalf("refused open created %s", storFile)
				}
			}
		})
	}
}

func TestStorageCloseIdempotent(t *testing.T) {
	s, _ := storOpenTest(t, t.TempDir())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.SetPromised(Ballot{Round: 1}); err == nil {
		t.Fatal("write after Close succeeded")
	}
}

func TestStorageRefusesSlotZero(t *testing.T) {
	dir := t.TempDir()
	s, _ := storOpenTest(t, dir)
	b := Ballot{Round: 4}
	if err := s.Accept(b, []Entry{{Slot: 1, Ballot: b}, {Slot: 0, Ballot: b}}); err == nil {
		t.Fatal("Accept of slot 0 succeeded")
	}
	s.Close()
	if _, st := storOpenTest(t, dir); !st.Promised.IsZero() || len(st.Entries) != 0 {
		t.Fatalf("refused Accept wrote %+v", st)
	}
}

func BenchmarkStorageAccept(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			s, _, err := OpenStorage(b.TempDir(), "g", 1, storTestPeers)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ballot := Ballot{Round: 1, Node: 1}
			var slot uint64
			b.ReportAllocs()
			for b.Loop() {
				es := storTestEntries(slot+1, slot+uint64(n), ballot)
				slot += uint64(n)
				if err := s.Accept(ballot, es); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(slot), "ns/entry")
		})
	}
}
