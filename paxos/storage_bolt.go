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

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// The bbolt file of a data dir: the node's identity and its latest
// snapshot, and, in the earlier layout, the acceptor state too.

// moveToLog writes the acceptor state st that a dir of the earlier layout
// kept in bbolt to a new log, then marks the dir as of this layout and
// drops the state from bbolt. A crash between the two leaves the earlier
// layout, moved again on the next open.
func (s *Storage) moveToLog(st State) error {
	ws := walState{promised: st.Promised, commit: st.Commit}
	for _, e := range st.Entries {
		v, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode slot %d: %w", e.Slot, err)
		}
		ws.entries.put(e.Slot, v)
	}
	gens, _, err := walGenerations(s.dir)
	if err != nil {
		return err
	}
	gen := uint64(1)
	if len(gens) > 0 {
		gen = gens[len(gens)-1] + 1
	}
	f, err := walCreate(s.dir, gen, ws)
	if err != nil {
		return err
	}
	s.log, s.gen, s.st = f, gen, ws
	err = s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(storBucketMeta)
		for _, k := range [][]byte{storKeyPromised, storKeyCommit} {
			if err := meta.Delete(k); err != nil {
				return err
			}
		}
		if tx.Bucket(storBucketEntries) != nil {
			if err := tx.DeleteBucket(storBucketEntries); err != nil {
				return err
			}
		}
		if err := meta.Put(storKeyLog, storU64(1)); err != nil {
			return err
		}
		return meta.Put(storKeyFormat, storU64(storFormat))
	})
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("move acceptor state to the log: %w", err)
	}
	for _, old := range gens {
		_ = os.Remove(filepath.Join(s.dir, walName(old))) // a try cut short; the next open removes it too
	}
	return nil
}

// storOpenBolt opens path, replacing a file torn while bbolt was creating
// it (never one whose dir holds an acceptor log).
func storOpenBolt(dir, path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: storOpenTimeout})
	if err == nil {
		return db, nil
	}
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("%w: %s is locked; stop the node using it, or give this node another data dir: %w",
			ErrDataDirInUse, path, err)
	}
	info, statErr := os.Stat(path)
	gens, _, _ := walGenerations(dir)
	if statErr != nil || info.Size() > int64(storFreshPages*os.Getpagesize()) || len(gens) > 0 {
		return nil, fmt.Errorf("paxos: open storage %s: not a readable paxos database: %w; %s", path, err, storStartAfresh)
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

// storLoad reads the identity, the members and the snapshot (and, from a
// dir of the earlier layout, format storFormatBolt, the acceptor state)
// and returns the dir's format and whether the acceptor's log was made; a
// file without identity is initialized for group, id and peers (format 0:
// created now).
func storLoad(db *bolt.DB, dir, group string, id NodeID, peers []Peer) (st State, format uint64, hasLog bool, err error) {
	err = db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(storBucketMeta)
		if meta == nil {
			return nil
		}
		if format, err = storCheckIdentity(meta, dir, group, id); err != nil {
			return err
		}
		hasLog = meta.Get(storKeyLog) != nil
		st, err = storReadState(tx, format == storFormatBolt)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrWrongGroup) {
			return State{}, 0, false, err
		}
		return State{}, 0, false, fmt.Errorf("paxos: open storage %s: %w", dir, err)
	}
	if format != 0 {
		return st, format, hasLog, nil
	}
	members, err := json.Marshal(peers)
	if err != nil {
		return State{}, 0, false, fmt.Errorf("paxos: open storage: encode members: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(storBucketMeta)
		if err != nil {
			return err
		}
		for _, kv := range [][2][]byte{
			{storKeyFormat, storU64(storFormat)}, {storKeyGroup, []byte(group)}, {storKeyID, storU64(uint64(id))}, {storKeyMembers, members},
		} {
			if err := meta.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		_, err = tx.CreateBucketIfNotExists(storBucketSnapshot)
		return err
	})
	if err != nil {
		return State{}, 0, false, fmt.Errorf("paxos: open storage %s: initialize: %w", dir, err)
	}
	return State{Members: append([]Peer(nil), peers...)}, 0, false, nil
}

// storCheckIdentity refuses a dir of an unknown format, another group or
// another node id, and returns its format.
func storCheckIdentity(meta *bolt.Bucket, dir, group string, id NodeID) (uint64, error) {
	f, ok := storGetU64(meta.Get(storKeyFormat))
	if !ok || (f != storFormat && f != storFormatBolt) {
		return 0, fmt.Errorf("unknown storage format %d (this build reads formats %d and %d)", f, storFormatBolt, storFormat)
	}
	hasGroup := string(meta.Get(storKeyGroup))
	hasID, ok := storGetU64(meta.Get(storKeyID))
	if !ok {
		return 0, errors.New("node id missing")
	}
	if hasGroup != group || NodeID(hasID) != id {
		return 0, &WrongGroupError{Dir: dir, Group: hasGroup, ID: NodeID(hasID), WantGroup: group, WantID: id}
	}
	return f, nil
}

// storReadState reads the members and the snapshot, and with legacy the
// acceptor state the earlier layout kept in bbolt.
func storReadState(tx *bolt.Tx, legacy bool) (State, error) {
	var st State
	meta, snapB := tx.Bucket(storBucketMeta), tx.Bucket(storBucketSnapshot)
	if snapB == nil {
		return State{}, errors.New("snapshot bucket missing")
	}
	if err := json.Unmarshal(meta.Get(storKeyMembers), &st.Members); err != nil {
		return State{}, fmt.Errorf("decode members: %w", err)
	}
	snap, err := storReadSnapshot(snapB)
	if err != nil {
		return State{}, err
	}
	st.Snapshot = snap
	if !legacy {
		return st, nil
	}
	entries := tx.Bucket(storBucketEntries)
	if entries == nil {
		return State{}, errors.New("entries bucket missing")
	}
	st.Promised = storGetBallot(meta.Get(storKeyPromised))
	st.Commit, _ = storGetU64(meta.Get(storKeyCommit))
	c := entries.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
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
