package paxos

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The acceptor's log: its promises, accepted entries and commit index as
// records appended to one file and made durable with one fsync per write,
// in front of the bbolt file that keeps the node's identity and its
// latest snapshot. A bbolt commit writes the changed B+tree pages and then
// its meta page, with an fsync after each; an append writes only the batch
// and syncs once, which halves the durable write every reply waits for
// (docs/BENCHMARKS.md, "The Paxos lock service").
//
// It is written here, not taken from etcd's WAL package, because that log
// holds Raft entries, which are contiguous and each overwrite the tail
// after them; an acceptor accepts slots out of order and with gaps, and a
// slot's later acceptance replaces only that slot.
//
// Layout: dir/acceptor-<generation>.log, one generation at a time. Each
// record is a 4-byte length, a 4-byte CRC-32C of the payload, and the
// payload: the promised ballot (round, node), the commit index, and the
// entries, each a 4-byte length and its JSON. Replaying a log raises the
// promise and the commit to each record's and puts each entry in its
// slot. A snapshot starts the next generation with one record of the whole
// state above the snapshot, written to a temporary file, synced, renamed
// into place, and then the older generation is removed.

const (
	walPrefix = "acceptor-"
	walSuffix = ".log"
	walTemp   = ".tmp"
	// walHeader is a record's length and checksum.
	walHeader = 8
	// walMaxRecord bounds a record's payload: a larger length is damage.
	walMaxRecord = 1 << 30
)

var walTable = crc32.MakeTable(crc32.Castagnoli)

// walState is what a log holds once replayed.
type walState struct {
	promised Ballot
	commit   uint64
	// entries are the accepted entries by slot, as encoded (JSON).
	entries map[uint64][]byte
}

// walName is the file of generation gen.
func walName(gen uint64) string { return fmt.Sprintf("%s%016d%s", walPrefix, gen, walSuffix) }

// walAppendRecord appends to buf one record of promised, commit and the
// encoded entries ents.
func walAppendRecord(buf []byte, promised Ballot, commit uint64, ents [][]byte) []byte {
	start := len(buf)
	buf = append(buf, make([]byte, walHeader)...)
	buf = append(buf, storBallot(promised)...)
	buf = binary.BigEndian.AppendUint64(buf, commit)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(ents)))
	for _, e := range ents {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(e)))
		buf = append(buf, e...)
	}
	payload := buf[start+walHeader:]
	binary.BigEndian.PutUint32(buf[start:], uint32(len(payload)))
	binary.BigEndian.PutUint32(buf[start+4:], crc32.Checksum(payload, walTable))
	return buf
}

// walApply replays one record's payload p onto st.
func walApply(st *walState, p []byte) error {
	if len(p) < 16+8+4 {
		return errors.New("record too short")
	}
	if b := storGetBallot(p[:16]); st.promised.Less(b) {
		st.promised = b
	}
	st.commit = max(st.commit, binary.BigEndian.Uint64(p[16:24]))
	n := binary.BigEndian.Uint32(p[24:28])
	p = p[28:]
	for i := uint32(0); i < n; i++ {
		if len(p) < 4 || uint64(len(p)-4) < uint64(binary.BigEndian.Uint32(p)) {
			return fmt.Errorf("entry %d of %d cut short", i+1, n)
		}
		l := binary.BigEndian.Uint32(p)
		v := p[4 : 4+l]
		var e Entry
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("entry %d of %d: %w", i+1, n, err)
		}
		st.entries[e.Slot] = bytes.Clone(v)
		p = p[4+l:]
	}
	if len(p) != 0 {
		return errors.New("bytes after the last entry")
	}
	return nil
}

// walReplay replays data, a log file's bytes, and returns the state and
// how many bytes hold whole records. What follows them is a torn tail (a
// write the crash cut short, never synced, so never answered for): a
// header cut short, a record running past the end, a last record whose
// checksum fails, or zeros to the end. A damaged record with more after
// it is an error: a synced write was lost.
func walReplay(data []byte) (walState, int, error) {
	st := walState{entries: map[uint64][]byte{}}
	off := 0
	for off < len(data) {
		rest := data[off:]
		if len(rest) < walHeader {
			return st, off, nil
		}
		l := int64(binary.BigEndian.Uint32(rest))
		end := walHeader + l
		if end >= int64(len(rest)) && (end > int64(len(rest)) || crc32.Checksum(rest[walHeader:], walTable) != binary.BigEndian.Uint32(rest[4:])) {
			return st, off, nil // runs past the end, or the last one and damaged
		}
		if l == 0 || l > walMaxRecord || crc32.Checksum(rest[walHeader:end], walTable) != binary.BigEndian.Uint32(rest[4:]) {
			if allZero(rest) {
				return st, off, nil
			}
			return st, off, fmt.Errorf("damaged record at byte %d, with more records after it", off)
		}
		if err := walApply(&st, rest[walHeader:end]); err != nil {
			return st, off, fmt.Errorf("record at byte %d: %w", off, err)
		}
		off += int(end)
	}
	return st, off, nil
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// walGenerations returns the generations of the log files in dir, oldest
// first, and the temporary files there (a generation a crash stopped
// before it was renamed into place, never used).
func walGenerations(dir string) (gens []uint64, temps []string, err error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read data dir: %w", err)
	}
	for _, de := range des {
		name := de.Name()
		if !strings.HasPrefix(name, walPrefix) {
			continue
		}
		if strings.HasSuffix(name, walSuffix+walTemp) {
			temps = append(temps, name)
			continue
		}
		num, ok := strings.CutSuffix(strings.TrimPrefix(name, walPrefix), walSuffix)
		gen, err := strconv.ParseUint(num, 10, 64)
		if !ok || err != nil {
			continue
		}
		gens = append(gens, gen)
	}
	slices.Sort(gens)
	return gens, temps, nil
}

// walOpen replays the newest log generation in dir, cuts off a torn tail,
// removes older generations and temporary files, and returns the file,
// open for appending. ok is false when dir holds no log. The caller holds
// the dir (its bbolt file's lock).
func walOpen(dir string) (f *os.File, gen uint64, st walState, ok bool, err error) {
	gens, temps, err := walGenerations(dir)
	if err != nil {
		return nil, 0, walState{}, false, err
	}
	for _, name := range temps {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return nil, 0, walState{}, false, fmt.Errorf("remove %s: %w", name, err)
		}
	}
	if len(gens) == 0 {
		return nil, 0, walState{}, false, nil
	}
	gen = gens[len(gens)-1]
	path := filepath.Join(dir, walName(gen))
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, walState{}, false, fmt.Errorf("read acceptor log: %w", err)
	}
	st, good, err := walReplay(data)
	if err != nil {
		return nil, 0, walState{}, false, fmt.Errorf("acceptor log %s: %w (move the data dir away to start this node afresh; it will catch up from its peers)", path, err)
	}
	f, err = os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, walState{}, false, fmt.Errorf("open acceptor log: %w", err)
	}
	if good < len(data) {
		if err := walCut(f, int64(good)); err != nil {
			_ = f.Close()
			return nil, 0, walState{}, false, err
		}
	}
	for _, old := range gens[:len(gens)-1] {
		if err := os.Remove(filepath.Join(dir, walName(old))); err != nil && !errors.Is(err, os.ErrNotExist) {
			_ = f.Close()
			return nil, 0, walState{}, false, fmt.Errorf("remove old acceptor log: %w", err)
		}
	}
	return f, gen, st, true, nil
}

// walCut truncates f to size, durably: the torn tail is gone before
// anything is appended after it.
func walCut(f *os.File, size int64) error {
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("cut torn tail of acceptor log: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("cut torn tail of acceptor log: %w", err)
	}
	return nil
}

// walCreate writes generation gen of the log in dir holding st in one
// record, durably (written to a temporary file, synced, renamed into
// place, the dir synced), and returns it open for appending.
func walCreate(dir string, gen uint64, st walState) (*os.File, error) {
	slots := make([]uint64, 0, len(st.entries))
	for s := range st.entries {
		slots = append(slots, s)
	}
	slices.Sort(slots)
	ents := make([][]byte, len(slots))
	for i, s := range slots {
		ents[i] = st.entries[s]
	}
	final := filepath.Join(dir, walName(gen))
	tmp := final + walTemp
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create acceptor log: %w", err)
	}
	fail := func(err error) (*os.File, error) {
		_ = f.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("create acceptor log: %w", err)
	}
	if _, err := f.Write(walAppendRecord(nil, st.promised, st.commit, ents)); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fail(err)
	}
	if err := storSyncDir(dir); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("create acceptor log: %w", err)
	}
	return f, nil
}
