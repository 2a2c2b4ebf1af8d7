package paxos

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// walRecords counts the whole records in the storage's current log file.
func walRecords(t *testing.T, s *Storage) int {
	t.Helper()
	s.mu.Lock()
	path := filepath.Join(s.dir, walName(s.gen))
	s.mu.Unlock()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for off := 0; off < len(data); count++ {
		n, ok := walRecordAt(data, off)
		if !ok {
			if len(bytes.TrimLeft(data[off:], "\x00")) == 0 {
				break // the zeros written ahead
			}
			t.Fatalf("%s: no whole record at byte %d", path, off)
		}
		off += n
	}
	return count
}

// waitDurable waits for the writer to report seq durable, or an error.
func waitDurable(t *testing.T, w *writer, seq uint64) error {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		durable, _, err := w.report()
		if err != nil || durable >= seq {
			return err
		}
		select {
		case <-w.notify:
		case <-deadline:
			t.Fatalf("seq %d not durable within 5 s (durable %d)", seq, durable)
		}
	}
}

func writerEntry(slot uint64) Entry {
	return Entry{Slot: slot, Ballot: Ballot{Round: 1}, Cmd: Command{Op: OpAcquire, ID: fmt.Sprint("c", slot), Lock: "l", Owner: "o", TTL: 1000}}
}

// TestWriterGroupsWaitingJobs: while one write waits on the disk (here,
// on the storage's lock), the jobs submitted meanwhile are reported
// durable only after it, and all together in one record; a job with the
// commit alone writes no record. Reopened, the storage holds every entry,
// the highest promise and the last commit.
func TestWriterGroupsWaitingJobs(t *testing.T) {
	dir := t.TempDir()
	s, _, err := OpenStorage(dir, "g", 0, []Peer{{ID: 0}})
	if err != nil {
		t.Fatal(err)
	}
	w := newWriter(s)
	before := walRecords(t, s)

	s.mu.Lock()
	w.submit(writeJob{seq: 1, promised: Ballot{Round: 1}, entries: []Entry{writerEntry(1)}, write: true})
	for taken := false; !taken; time.Sleep(time.Millisecond) {
		w.mu.Lock()
		taken = len(w.queue) == 0
		w.mu.Unlock()
	}
	for i := uint64(2); i <= 5; i++ {
		w.submit(writeJob{seq: i, promised: Ballot{Round: i}, entries: []Entry{writerEntry(i)}, write: true, commit: i - 1})
	}
	time.Sleep(20 * time.Millisecond)
	if durable, _, err := w.report(); durable != 0 || err != nil {
		t.Fatalf("with the disk held, the writer reports %d durable (err %v)", durable, err)
	}
	s.mu.Unlock()
	if err := waitDurable(t, w, 5); err != nil {
		t.Fatal(err)
	}
	if got := walRecords(t, s); got != before+2 {
		t.Fatalf("5 jobs, 4 of them waiting behind the first: %d records written, want 2", got-before)
	}
	w.submit(writeJob{seq: 6, commit: 5})
	if err := waitDurable(t, w, 6); err != nil {
		t.Fatal(err)
	}
	if got := walRecords(t, s); got != before+2 {
		t.Fatalf("a job with only the commit wrote %d records", got-before-2)
	}
	w.close()
	w.close()
	if err := s.Close(); err != nil { // writes the commit that moved
		t.Fatal(err)
	}

	s, st, err := OpenStorage(dir, "g", 0, []Peer{{ID: 0}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st.Promised != (Ballot{Round: 5}) || st.Commit != 5 || len(st.Entries) != 5 {
		t.Fatalf("reopened: promised %v, commit %d, %d entries; want {5 0}, 5, 5", st.Promised, st.Commit, len(st.Entries))
	}
	for i, e := range st.Entries {
		if e != writerEntry(uint64(i+1)) {
			t.Fatalf("entry %d = %+v, want %+v", i, e, writerEntry(uint64(i+1)))
		}
	}
}

// TestWriterStopsOnAFailedWrite: a write that fails (the log file is gone
// from under the storage) is reported, nothing after it is reported
// durable, the storage takes no more writes, and the writer's goroutine
// ends (a later submit does not block, close returns).
func TestWriterStopsOnAFailedWrite(t *testing.T) {
	s, _, err := OpenStorage(t.TempDir(), "g", 0, []Peer{{ID: 0}})
	if err != nil {
		t.Fatal(err)
	}
	w := newWriter(s)
	w.submit(writeJob{seq: 1, entries: []Entry{writerEntry(1)}, write: true})
	if err := waitDurable(t, w, 1); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.mu.Lock()
	_ = s.log.Close() // the next append fails
	s.mu.Unlock()
	w.submit(writeJob{seq: 2, entries: []Entry{writerEntry(2)}, write: true})
	if err := waitDurable(t, w, 2); err == nil {
		t.Fatal("a write to a closed storage was reported durable")
	}
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer did not end after a failed write")
	}
	if err := s.Accept(Ballot{}, []Entry{writerEntry(4)}); err == nil {
		t.Fatal("the storage took a write after one failed")
	}
	w.submit(writeJob{seq: 3, entries: []Entry{writerEntry(3)}, write: true})
	w.close()
	if durable, _, err := w.report(); durable != 1 || err == nil {
		t.Fatalf("after the failure: durable %d, err %v; want 1 and the error", durable, err)
	}
}

// TestDiskStallHoldsUpNoChoice holds one node's storage (every write of
// its acceptor waits, as on a disk that stalls) while commands are
// proposed at every node. With the leader's disk held, its two followers
// are the majority that accepts; with a follower's, that follower still
// learns what is chosen and answers its own callers. The held node's
// replies wait for its writes, and once its disk is back it catches up:
// the logs agree.
func TestDiskStallHoldsUpNoChoice(t *testing.T) {
	for _, held := range []string{"leader", "follower"} {
		t.Run(held, func(t *testing.T) {
			c := newTestCluster(t, 3, nil)
			defer c.close()
			c.startAll()
			leader := c.leader(5 * time.Second)
			ballot := leader.Status().Ballot
			n := leader
			if held == "follower" {
				n = c.node((leader.cfg.ID + 1) % 3)
			}
			c.mustPropose(leader.cfg.ID, Command{Op: OpAcquire, Lock: "warm", Owner: "o", TTL: 60000})
			n.store.mu.Lock()
			for i := range 30 {
				at := NodeID(i % 3)
				res, err := c.propose(at, Command{Op: OpAcquire, Lock: fmt.Sprint("l", i), Owner: "o", TTL: 60000}, time.Second)
				if err != nil || res.Code != CodeOK {
					n.store.mu.Unlock()
					t.Fatalf("with the %s's disk held, acquire %d at node %d = %+v, %v", held, i, at, res, err)
				}
			}
			n.store.mu.Unlock()
			c.converge(5 * time.Second)
			if st := leader.Status(); st.Role != "leader" || st.Ballot != ballot {
				t.Fatalf("the leader changed during the stall: node %d is %s at %v (was leader at %v)", leader.cfg.ID, st.Role, st.Ballot, ballot)
			}
			c.stopAndCompare()
		})
	}
}
