package paxos

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// State is what a node persisted: its acceptor state, how far it knows the
// log is chosen, and its latest snapshot.
type State struct {
	// Promised is the highest ballot promised.
	Promised Ballot
	// Commit is the highest slot known chosen. It may lag what the node
	// knew before a crash, never lead it. It is at least Snapshot.Index.
	Commit uint64
	// Entries are the accepted entries above Snapshot.Index, ordered by
	// slot.
	Entries []Entry
	// Snapshot is the latest snapshot saved, nil if none.
	Snapshot *Snapshot
	// Members are the initial members this data dir was created with.
	Members []Peer
}

// ErrWrongGroup matches (with errors.Is) the refusal of a data dir that
// holds another group's or another node id's state. The error itself is a
// *WrongGroupError saying which group and node id the dir holds.
var ErrWrongGroup = errors.New("paxos: data dir belongs to another group")

// ErrDataDirInUse matches (with errors.Is) the refusal of a data dir that
// another process has open: two nodes must never share acceptor state.
var ErrDataDirInUse = errors.New("paxos: data dir in use by another process")

var errStorageClosed = errors.New("storage closed")

// WrongGroupError is the refusal of a data dir created for another group or
// another node id. Nothing is written to the dir. It matches ErrWrongGroup
// with errors.Is.
type WrongGroupError struct {
	// Dir is the data dir refused.
	Dir string
	// Group and ID are what the dir holds.
	Group string
	ID    NodeID
	// WantGroup and WantID are what the caller asked for.
	WantGroup string
	WantID    NodeID
}

// Error says which group and node id the dir holds and what to do.
func (e *WrongGroupError) Error() string {
	return fmt.Sprintf("paxos: data dir %s holds group %q node %d, not group %q node %d: "+
		"give this node a data dir of its own (a new or empty dir is fine), "+
		"or start it as group %q node %d to use this one",
		e.Dir, e.Group, e.ID, e.WantGroup, e.WantID, e.Group, e.ID)
}

// Is reports whether target is ErrWrongGroup.
func (e *WrongGroupError) Is(target error) bool { return target == ErrWrongGroup }

const (
	// storFile is the bbolt file inside the data dir.
	storFile = "paxos.db"
	// storFormat is the layout version written in the meta bucket: the
	// acceptor's state in its log (wal.go), the identity and the snapshot
	// in bbolt.
	storFormat = 2
	// storFormatBolt is the earlier layout, which kept the acceptor's
	// state in bbolt too; a dir of it is moved to the log when opened.
	storFormatBolt = 1
	// storOpenTimeout bounds the wait for the file lock another process
	// holds.
	storOpenTimeout = time.Second
	// storFreshPages is how many pages bbolt writes when it creates a file.
	// A file that size or smaller never held a commit of ours.
	storFreshPages = 4
)

// Layout: bucket "meta" holds the identity, bucket "snapshot" the latest
// snapshot (its Data stored raw). Format 1 also kept the promise and the
// commit index in "meta" and the entries in bucket "entries" (big-endian
// slot numbers to JSON).
var (
	storBucketMeta     = []byte("meta")
	storBucketEntries  = []byte("entries")
	storBucketSnapshot = []byte("snapshot")

	storKeyFormat   = []byte("format")
	storKeyGroup    = []byte("group")
	storKeyID       = []byte("id")
	storKeyMembers  = []byte("members")
	storKeyPromised = []byte("promised")
	storKeyCommit   = []byte("commit")
	storKeyIndex    = []byte("index")
	storKeyData     = []byte("data")
	// storKeyLog is set once the acceptor's log was made: from then on a
	// missing log is refused, not started afresh.
	storKeyLog = []byte("log")
)

// storStartAfresh is what to do with a data dir whose acceptor state is
// lost: such a node must not vote again as if it had promised nothing.
const storStartAfresh = "to start this node afresh, move the data dir away, remove the node from the group " +
	"(drover paxos members remove), then start it with --join and add it again (drover paxos members add)"

// Storage is a node's durable state in dir: the acceptor's promises,
// accepted entries and commit index in an append-only log (see wal.go),
// its identity and latest snapshot in dir/paxos.db (bbolt). A promise or
// an acceptance is synced before the method returns, so a node may reply
// as soon as the write that justifies the reply has returned. Methods are
// safe for concurrent use; the node's run loop is expected to be the only
// writer but for SaveSnapshot, which may also run on a goroutine of its
// own. After a failed write every later one fails: the log may end in part
// of a record, which only a reopen cuts off.
type Storage struct {
	mu   sync.Mutex
	db   *bolt.DB
	dir  string
	path string
	log  *walFile
	gen  uint64
	// st is what the log holds: entries above snapIndex only.
	st        walState
	snapIndex uint64
	buf       []byte
	// commitDirty: the commit index moved since the last record.
	commitDirty bool
	failed      error
}

// OpenStorage opens the state in dir, creating dir, dir/paxos.db and the
// acceptor's log on first use and recording group, id and peers there. An
// absent bbolt file, or one torn while it was being created, is a fresh
// start; so is a log's torn tail (a write cut short, never answered for).
// A dir holding another group's or another node id's state is refused with
// a *WrongGroupError (errors.Is ErrWrongGroup) and nothing is written. A
// dir another process has open is refused with ErrDataDirInUse after a
// short wait. On reopen, peers is ignored: State.Members are the recorded
// ones. A dir of the earlier layout (acceptor state in bbolt) is moved to
// the log.
func OpenStorage(dir, group string, id NodeID, peers []Peer) (*Storage, State, error) {
	if dir == "" {
		return nil, State{}, errors.New("paxos: open storage: no data dir given")
	}
	if group == "" {
		return nil, State{}, errors.New("paxos: open storage: no group given")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, State{}, fmt.Errorf("paxos: open storage: create data dir: %w", err)
	}
	path := filepath.Join(dir, storFile)
	if err := storLogAlone(dir, path); err != nil {
		return nil, State{}, err
	}
	db, err := storOpenBolt(dir, path)
	if err != nil {
		return nil, State{}, err
	}
	st, format, hasLog, err := storLoad(db, dir, group, id, peers)
	if err != nil {
		_ = db.Close()
		return nil, State{}, err
	}
	s := &Storage{db: db, dir: dir, path: path}
	if st.Snapshot != nil {
		s.snapIndex = st.Snapshot.Index
	}
	if format == storFormatBolt {
		err = s.moveToLog(st)
	} else {
		err = s.openLog(hasLog || st.Snapshot != nil)
	}
	if err != nil {
		_ = db.Close()
		return nil, State{}, fmt.Errorf("paxos: open storage %s: %w", dir, err)
	}
	s.st.entries.keepAbove(s.snapIndex)
	s.st.commit = max(s.st.commit, s.snapIndex)
	st.Promised, st.Commit = s.st.promised, s.st.commit
	if st.Entries, err = s.st.sorted(); err != nil {
		_ = s.Close()
		return nil, State{}, fmt.Errorf("paxos: open storage %s: %w", dir, err)
	}
	return s, st, nil
}

// openLog opens the acceptor's log, or starts one when there is none and
// none was ever made (a dir just created, or one whose creation a crash
// cut short); hadLog says one was: its absence is then refused. Once the
// log is there, the bbolt file records that it is.
func (s *Storage) openLog(hadLog bool) error {
	f, gen, st, ok, err := walOpen(s.dir)
	if err != nil {
		return err
	}
	if !ok {
		if hadLog {
			return fmt.Errorf("the acceptor's log (%s*%s) is missing: restore it; %s", walPrefix, walSuffix, storStartAfresh)
		}
		st, gen = walState{}, 1
		if f, err = walCreate(s.dir, gen, st); err != nil {
			return err
		}
	}
	s.log, s.gen, s.st = f, gen, st
	if !hadLog {
		if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(storBucketMeta).Put(storKeyLog, storU64(1)) }); err != nil {
			_ = f.Close()
			return fmt.Errorf("record the acceptor's log: %w", err)
		}
	}
	return nil
}

// storLogAlone refuses a dir holding an acceptor log but no bbolt file,
// which would say whose it is, before anything is created there.
func storLogAlone(dir, path string) error {
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		return nil // there, or not readable: opening it tells
	}
	gens, _, err := walGenerations(dir)
	if err != nil {
		return fmt.Errorf("paxos: open storage %s: %w", dir, err)
	}
	if len(gens) > 0 {
		return fmt.Errorf("paxos: open storage %s: it holds an acceptor log (%s) but no %s, which says whose it is: restore %s, or move the dir away",
			dir, walName(gens[len(gens)-1]), storFile, storFile)
	}
	return nil
}

// sorted decodes the entries, ordered by slot (as slots gives them).
func (st walState) sorted() ([]Entry, error) {
	if st.entries.len() == 0 {
		return nil, nil
	}
	out := make([]Entry, 0, st.entries.len())
	for _, slot := range st.entries.slots() {
		v, _ := st.entries.get(slot)
		var e Entry
		if err := json.Unmarshal(v, &e); err != nil {
			return nil, fmt.Errorf("decode entry at slot %d: %w", slot, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// usable returns why the storage takes no more writes, if so; the caller
// holds mu.
func (s *Storage) usable(what string) error {
	if s.db == nil {
		return fmt.Errorf("paxos: %s: %w", what, errStorageClosed)
	}
	if s.failed != nil {
		return fmt.Errorf("paxos: %s: an earlier write failed: %w", what, s.failed)
	}
	return nil
}

// write appends one record of the promise, the commit index and ents to
// the log and syncs it; the caller holds mu.
func (s *Storage) write(what string, ents [][]byte) error {
	s.buf = walAppendRecord(s.buf[:0], s.st.promised, s.st.commit, ents)
	if err := s.log.append(s.buf); err != nil {
		s.failed = err
		return fmt.Errorf("paxos: %s: %w", what, err)
	}
	s.commitDirty = false
	return nil
}

// SetPromised records a promise for ballot b, durably, before it returns.
// A ballot at or below the stored promise changes nothing.
func (s *Storage) SetPromised(b Ballot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable("save promise"); err != nil {
		return err
	}
	if !s.st.promised.Less(b) {
		return nil
	}
	s.st.promised = b
	return s.write("save promise", nil)
}

// Accept records, in one synced write, the promise promised (raised
// only) and the entries es, each overwriting what its slot held. Entries
// at or below the snapshot's index are already covered by the snapshot and
// are skipped. Slot 0 is not a slot: it is refused and nothing is written.
func (s *Storage) Accept(promised Ballot, es []Entry) error {
	return s.acceptCommit(promised, 0, es, true)
}

// acceptCommit is Accept that also raises the commit index to commit, in
// the same record, under one hold of the lock: a snapshot's next
// generation (written from the state in memory) can never hold the
// commit without the entries it covers. With write false and no entries
// it only raises the commit in memory, as SetCommit does.
func (s *Storage) acceptCommit(promised Ballot, commit uint64, es []Entry, write bool) error {
	vals := make([][]byte, len(es))
	for i, e := range es {
		if e.Slot == 0 {
			return errors.New("paxos: accept: entry for slot 0 (slots start at 1)")
		}
		v, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("paxos: accept: encode slot %d: %w", e.Slot, err)
		}
		vals[i] = v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable("accept"); err != nil {
		return err
	}
	if s.st.promised.Less(promised) {
		s.st.promised = promised
	}
	if commit > s.st.commit {
		s.st.commit = commit
		s.commitDirty = true
	}
	if !write && len(es) == 0 {
		return nil
	}
	keep := vals[:0]
	var slots []uint64
	for i, e := range es {
		if e.Slot > s.snapIndex {
			keep = append(keep, vals[i])
			slots = append(slots, e.Slot)
		}
	}
	if err := s.write("accept", keep); err != nil {
		return err
	}
	for i, slot := range slots {
		s.st.entries.put(slot, keep[i])
	}
	return nil
}

// SetCommit records that every slot up to c is chosen. A value at or below
// the stored one changes nothing. It is written with the next promise or
// acceptance (every record carries the commit index), or by Close: the
// commit index may lag after a crash, never lead. Writing only synced
// records keeps a crash's damage to the one record being written.
func (s *Storage) SetCommit(c uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable("save commit"); err != nil {
		return err
	}
	if c > s.st.commit {
		s.st.commit = c
		s.commitDirty = true
	}
	return nil
}

// errSnapshotOlder is SaveSnapshot's refusal of a snapshot older than the
// stored one: a node that saves its own snapshot in the background while
// it installs a newer one from a peer gets it, and loses nothing.
var errSnapshotOlder = errors.New("older than the stored snapshot")

// SaveSnapshot stores snap in bbolt (synced) and then starts the next
// generation of the log with the entries above snap.Index only; Commit is
// raised to snap.Index. A snapshot older than the stored one is refused
// with an error matching errSnapshotOlder. When the new generation cannot
// be written, the storage takes no more writes.
//
// It may run on another goroutine than the writes of the log: the bbolt
// write, which is as large as the table, does not hold up Accept; only the
// switch to the next generation does.
func (s *Storage) SaveSnapshot(snap Snapshot) error {
	what := fmt.Sprintf("save snapshot at %d", snap.Index)
	members, err := json.Marshal(snap.Members)
	if err != nil {
		return fmt.Errorf("paxos: %s: encode members: %w", what, err)
	}
	s.mu.Lock()
	db, err := s.db, s.usable(what)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	// bbolt orders its own writers. Of two snapshots saved at once, the
	// older is refused here if the newer committed first, and skipped
	// below (the newer one's generation stands) if it committed first.
	err = db.Update(func(tx *bolt.Tx) error {
		sb := tx.Bucket(storBucketSnapshot)
		if cur, ok := storGetU64(sb.Get(storKeyIndex)); ok && snap.Index < cur {
			return fmt.Errorf("%w at %d", errSnapshotOlder, cur)
		}
		for _, kv := range [][2][]byte{{storKeyIndex, storU64(snap.Index)}, {storKeyMembers, members}, {storKeyData, snap.Data}} {
			if err := sb.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("paxos: %s: %w", what, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(what); err != nil {
		return err
	}
	if snap.Index <= s.snapIndex {
		return nil // a newer snapshot, saved meanwhile, started its generation
	}
	return s.nextGeneration(what, snap.Index)
}

// nextGeneration drops the entries at or below index from memory and
// starts the log's next generation with the rest; the caller holds mu.
func (s *Storage) nextGeneration(what string, index uint64) error {
	s.snapIndex = index
	s.st.commit = max(s.st.commit, index)
	s.st.entries.keepAbove(index)
	f, err := walCreate(s.dir, s.gen+1, s.st)
	if err != nil {
		// The new generation may be in place (renamed, its dir not
		// synced): the next open would take it and drop the current
		// one, so nothing more may be written to the current one.
		s.failed = err
		return fmt.Errorf("paxos: %s: %w", what, err)
	}
	s.commitDirty = false
	old := s.log
	s.log, s.gen = f, s.gen+1
	_ = old.Close()
	_ = os.Remove(filepath.Join(s.dir, walName(s.gen-1))) // else the next open removes it
	return nil
}

// Close writes the commit index if it moved and closes the files, waiting for a write in
// progress. It is safe to call twice; writes after Close fail.
func (s *Storage) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil
	}
	var errs []error
	if s.log != nil {
		if s.failed == nil && s.commitDirty {
			errs = append(errs, s.write("save commit", nil))
		}
		errs = append(errs, s.log.Close())
	}
	errs = append(errs, s.db.Close())
	s.db, s.log = nil, nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("paxos: close storage %s: %w", s.dir, err)
	}
	return nil
}
