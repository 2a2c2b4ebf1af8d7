package paxos

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
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
	// storFormat is the layout version written in the meta bucket.
	storFormat = 1
	// storOpenTimeout bounds the wait for the file lock another process
	// holds.
	storOpenTimeout = time.Second
	// storFreshPages is how many pages bbolt writes when it creates a file.
	// A file that size or smaller never held a commit of ours.
	storFreshPages = 4
	// storFill is how full bbolt fills the entries bucket's pages when it
	// splits them: slots are appended in order, so pages are filled
	// (bbolt's advice for append-only keys) rather than left half empty.
	storFill = 0.95
)

// Layout: bucket "meta" holds the identity and the acceptor's scalars,
// bucket "entries" maps big-endian slot numbers to JSON entries, bucket
// "snapshot" holds the latest snapshot (its Data stored raw).
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
)

// Storage is a node's durable acceptor state in dir/paxos.db (bbolt).
// Every write is one bbolt transaction, fsynced before the method returns,
// so a node may reply to a message as soon as the write that justifies the
// reply has returned. Methods are safe for concurrent use; the node's run
// loop is expected to be the only writer.
type Storage struct {
	mu   sync.Mutex
	db   *bolt.DB
	path string
}

// OpenStorage opens the state in dir, creating dir and dir/paxos.db on
// first use and recording group, id and peers there. An absent file, or
// one torn while it was being created, is a fresh start. A dir holding
// another group's or another node id's state is refused with a
// *WrongGroupError (errors.Is ErrWrongGroup) and nothing is written. A dir
// another process has open is refused with ErrDataDirInUse after a short
// wait. On reopen, peers is ignored: State.Members are the recorded ones.
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
	db, err := storOpenBolt(path)
	if err != nil {
		return nil, State{}, err
	}
	st, created, err := storLoad(db, dir, group, id, peers)
	if err != nil {
		_ = db.Close()
		return nil, State{}, err
	}
	if created {
		if err := storSyncDir(dir); err != nil {
			_ = db.Close()
			return nil, State{}, fmt.Errorf("paxos: open storage: %w", err)
		}
	}
	return &Storage{db: db, path: path}, st, nil
}

// storOpenBolt opens path, replacing a file torn while bbolt was creating it.
func storOpenBolt(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: storOpenTimeout})
	if err == nil {
		return db, nil
	}
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s is locked; stop the node using it, or give this node another data dir: %w",
			ErrDataDirInUse, path, err)
	}
	info, statErr := os.Stat(path)
	if statErr != nil || info.Size() > int64(storFreshPages*os.Getpagesize()) {
		return nil, fmt.Errorf("paxos: open storage %s: not a readable paxos database (move it away to start this node afresh, "+
			"it will catch up from its peers): %w", path, err)
	}
	// bbolt writes its first pages in one write: a file no bigger than
	// them that does not open never held our state.
	if rmErr := os.Remove(path); rmErr != nil {
		return nil, fmt.Errorf("paxos: open storage %s: remove torn file: %w", path, rmErr)
	}
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: storOpenTimeout})
	if err != nil {
		return nil, fmt.Errorf("paxos: open storage %s: %w", path, err)
	}
	return db, nil
}

// storLoad reads the state, checking the identity first; a file without
// identity is initialized for group, id and peers (created is then true).
func storLoad(db *bolt.DB, dir, group string, id NodeID, peers []Peer) (State, bool, error) {
	var (
		st     State
		exists bool
	)
	err := db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(storBucketMeta)
		if meta == nil {
			return nil
		}
		exists = true
		if err := storCheckIdentity(meta, dir, group, id); err != nil {
			return err
		}
		var err error
		st, err = storReadState(tx)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrWrongGroup) {
			return State{}, false, err
		}
		return State{}, false, fmt.Errorf("paxos: open storage %s: %w", dir, err)
	}
	if exists {
		return st, false, nil
	}
	members, err := json.Marshal(peers)
	if err != nil {
		return State{}, false, fmt.Errorf("paxos: open storage: encode members: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(storBucketMeta)
		if err != nil {
			return err
		}
		for _, kv := range [][2][]byte{
			{storKeyFormat, storU64(storFormat)}, {storKeyGroup, []byte(group)}, {storKeyID, storU64(uint64(id))},
			{storKeyMembers, members}, {storKeyPromised, storBallot(Ballot{})}, {storKeyCommit, storU64(0)},
		} {
			if err := meta.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		if _, err := tx.CreateBucketIfNotExists(storBucketEntries); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(storBucketSnapshot)
		return err
	})
	if err != nil {
		return State{}, false, fmt.Errorf("paxos: open storage %s: initialize: %w", dir, err)
	}
	return State{Members: append([]Peer(nil), peers...)}, true, nil
}

// storCheckIdentity refuses a dir of another format, group or node id.
func storCheckIdentity(meta *bolt.Bucket, dir, group string, id NodeID) error {
	if f, ok := storGetU64(meta.Get(storKeyFormat)); !ok || f != storFormat {
		return fmt.Errorf("unknown storage format %d (this build reads format %d)", f, storFormat)
	}
	hasGroup := string(meta.Get(storKeyGroup))
	hasID, ok := storGetU64(meta.Get(storKeyID))
	if !ok {
		return errors.New("node id missing")
	}
	if hasGroup != group || NodeID(hasID) != id {
		return &WrongGroupError{Dir: dir, Group: hasGroup, ID: NodeID(hasID), WantGroup: group, WantID: id}
	}
	return nil
}

// storReadState reads everything but the identity.
func storReadState(tx *bolt.Tx) (State, error) {
	var st State
	meta, entries, snapB := tx.Bucket(storBucketMeta), tx.Bucket(storBucketEntries), tx.Bucket(storBucketSnapshot)
	if entries == nil || snapB == nil {
		return State{}, errors.New("buckets missing")
	}
	if err := json.Unmarshal(meta.Get(storKeyMembers), &st.Members); err != nil {
		return State{}, fmt.Errorf("decode members: %w", err)
	}
	st.Promised = storGetBallot(meta.Get(storKeyPromised))
	st.Commit, _ = storGetU64(meta.Get(storKeyCommit))
	snap, err := storReadSnapshot(snapB)
	if err != nil {
		return State{}, err
	}
	st.Snapshot = snap
	var from uint64 = 1
	if snap != nil {
		from = snap.Index + 1
		st.Commit = max(st.Commit, snap.Index)
	}
	c := entries.Cursor()
	for k, v := c.Seek(storU64(from)); k != nil; k, v = c.Next() {
		var e Entry
		if err := json.Unmarshal(v, &e); err != nil {
			return State{}, fmt.Errorf("decode entry at slot %d: %w", binary.BigEndian.Uint64(k), err)
		}
		e.Slot = binary.BigEndian.Uint64(k)
		st.Entries = append(st.Entries, e)
	}
	return st, nil
}

// storReadSnapshot reads the snapshot bucket; nil when none was saved.
func storReadSnapshot(b *bolt.Bucket) (*Snapshot, error) {
	idx, ok := storGetU64(b.Get(storKeyIndex))
	if !ok {
		return nil, nil
	}
	snap := &Snapshot{Index: idx, Data: bytes.Clone(b.Get(storKeyData))}
	if err := json.Unmarshal(b.Get(storKeyMembers), &snap.Members); err != nil {
		return nil, fmt.Errorf("decode snapshot members: %w", err)
	}
	return snap, nil
}

// update runs fn in one fsynced write transaction.
func (s *Storage) update(what string, fn func(tx *bolt.Tx) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return fmt.Errorf("paxos: %s: %w", what, errStorageClosed)
	}
	if err := s.db.Update(fn); err != nil {
		return fmt.Errorf("paxos: %s: %w", what, err)
	}
	return nil
}

// storRaisePromised stores b if it is above the stored promise: a promise
// never goes down.
func storRaisePromised(meta *bolt.Bucket, b Ballot) error {
	if storGetBallot(meta.Get(storKeyPromised)).Less(b) {
		return meta.Put(storKeyPromised, storBallot(b))
	}
	return nil
}

// SetPromised records a promise for ballot b, durably, before it returns.
// A ballot at or below the stored promise changes nothing.
func (s *Storage) SetPromised(b Ballot) error {
	return s.update("save promise", func(tx *bolt.Tx) error {
		return storRaisePromised(tx.Bucket(storBucketMeta), b)
	})
}

// Accept records, in one fsynced transaction, the promise promised (raised
// only) and the entries es, each overwriting what its slot held. Entries
// at or below the snapshot's index are already covered by the snapshot and
// are skipped. Slot 0 is not a slot: it is refused and nothing is written.
func (s *Storage) Accept(promised Ballot, es []Entry) error {
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
	return s.update("accept", func(tx *bolt.Tx) error {
		if err := storRaisePromised(tx.Bucket(storBucketMeta), promised); err != nil {
			return err
		}
		snapIndex, _ := storGetU64(tx.Bucket(storBucketSnapshot).Get(storKeyIndex))
		entries := tx.Bucket(storBucketEntries)
		entries.FillPercent = storFill
		for i, e := range es {
			if e.Slot <= snapIndex {
				continue
			}
			if err := entries.Put(storU64(e.Slot), vals[i]); err != nil {
				return fmt.Errorf("slot %d: %w", e.Slot, err)
			}
		}
		return nil
	})
}

// SetCommit records that every slot up to c is chosen. A value at or below
// the stored one changes nothing.
func (s *Storage) SetCommit(c uint64) error {
	return s.update("save commit", func(tx *bolt.Tx) error {
		meta := tx.Bucket(storBucketMeta)
		if cur, _ := storGetU64(meta.Get(storKeyCommit)); c <= cur {
			return nil
		}
		return meta.Put(storKeyCommit, storU64(c))
	})
}

// SaveSnapshot stores snap and deletes every entry with Slot <= snap.Index,
// in one transaction; Commit is raised to snap.Index. A snapshot older
// than the stored one is refused.
func (s *Storage) SaveSnapshot(snap Snapshot) error {
	members, err := json.Marshal(snap.Members)
	if err != nil {
		return fmt.Errorf("paxos: save snapshot: encode members: %w", err)
	}
	return s.update(fmt.Sprintf("save snapshot at %d", snap.Index), func(tx *bolt.Tx) error {
		sb := tx.Bucket(storBucketSnapshot)
		if cur, ok := storGetU64(sb.Get(storKeyIndex)); ok && snap.Index < cur {
			return fmt.Errorf("older than the stored snapshot at %d", cur)
		}
		for _, kv := range [][2][]byte{{storKeyIndex, storU64(snap.Index)}, {storKeyMembers, members}, {storKeyData, snap.Data}} {
			if err := sb.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		meta := tx.Bucket(storBucketMeta)
		if cur, _ := storGetU64(meta.Get(storKeyCommit)); cur < snap.Index {
			if err := meta.Put(storKeyCommit, storU64(snap.Index)); err != nil {
				return err
			}
		}
		return storTruncate(tx, snap.Index)
	})
}

// storTruncate deletes the entries with Slot <= index. The bucket is
// dropped whole and the entries above index (few: the undecided tail) are
// put back: freeing the bucket's pages costs far less than deleting keys
// one by one, which rebalances the tree at every commit of a big log.
func storTruncate(tx *bolt.Tx, index uint64) error {
	var keep [][2][]byte
	c := tx.Bucket(storBucketEntries).Cursor()
	for k, v := c.Seek(storU64(index + 1)); k != nil; k, v = c.Next() {
		keep = append(keep, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
	}
	if err := tx.DeleteBucket(storBucketEntries); err != nil {
		return err
	}
	b, err := tx.CreateBucket(storBucketEntries)
	if err != nil {
		return err
	}
	b.FillPercent = storFill
	for _, kv := range keep {
		if err := b.Put(kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the file, waiting for a write in progress. It is safe to
// call twice; writes after Close fail.
func (s *Storage) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil
	}
	err := s.db.Close()
	s.db = nil
	if err != nil {
		return fmt.Errorf("paxos: close storage %s: %w", s.path, err)
	}
	return nil
}

// storSyncDir fsyncs dir so a newly created file's name is durable too.
func storSyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync data dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return fmt.Errorf("sync data dir: %w", err)
	}
	return nil
}

// storU64 encodes v big-endian, so keys sort by slot.
func storU64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// storGetU64 decodes what storU64 made; ok is false for a missing or bad value.
func storGetU64(b []byte) (uint64, bool) {
	if len(b) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}

// storBallot encodes b as round then node, big-endian.
func storBallot(b Ballot) []byte {
	return binary.BigEndian.AppendUint64(storU64(b.Round), uint64(b.Node))
}

// storGetBallot decodes what storBallot made; the zero Ballot if malformed.
func storGetBallot(b []byte) Ballot {
	if len(b) != 16 {
		return Ballot{}
	}
	return Ballot{Round: binary.BigEndian.Uint64(b[:8]), Node: NodeID(binary.BigEndian.Uint64(b[8:]))}
}
