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

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
)

// The acceptor's log: its promises, accepted entries and commit index as
// records appended to one file and made durable with one fsync per write,
// in front of the bbolt file that keeps the node's identity and its
// latest snapshot. A bbolt commit writes the changed B+tree pages and then
// its meta page, with an fsync after each; an append writes only the batch
// and syncs once, which halves the durable write every reply waits for
// (docs/bench-log/paxos.md).
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
// into place, and then the older generation is removed. After the last
// record come zeros written ahead (walFile): replay stops there, and a
// torn record over them is cut off.

const (
	walPrefix = "acceptor-"
	walSuffix = ".log"
	walTemp   = ".tmp"
	// walHeader is a record's length and checksum.
	walHeader = 8
	// walMinPayload is the smallest payload: a ballot, a commit index
	// and a count of entries.
	walMinPayload = 16 + 8 + 4
	// walMaxRecord bounds a record's payload: a larger length is damage.
	walMaxRecord = 1 << 30
)

var walTable = crc32.MakeTable(crc32.Castagnoli)

// walState is what a log holds once replayed.
type walState struct {
	promised Ballot
	commit   uint64
	// entries are the accepted entries by slot, as encoded (JSON).
	entries walEntries
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
	if len(p) < walMinPayload {
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
		st.entries.put(e.Slot, v)
		p = p[4+l:]
	}
	if len(p) != 0 {
		return errors.New("bytes after the last entry")
	}
	return nil
}

// walReplay replays data, a log file's bytes, and returns the state and
// how many bytes hold whole records. A record that is cut short or fails
// its checksum ends the replay: when no whole record follows it anywhere,
// it is a torn tail (the one write a crash cut short: only the last write
// can be unsynced, and an unsynced write was never answered for); when a
// whole record follows, a synced write was damaged, which is an error.
func walReplay(data []byte) (walState, int, error) {
	var st walState
	off := 0
	for off < len(data) {
		n, ok := walRecordAt(data, off)
		if !ok {
			if len(bytes.TrimLeft(data[off:], "\x00")) == 0 {
				return st, off, nil // the zeros written ahead (walFile)
			}
			if next := walNextRecord(data, off+1); next >= 0 {
				return st, off, fmt.Errorf("damaged record at byte %d, with a whole record at byte %d after it", off, next)
			}
			return st, off, nil
		}
		if err := walApply(&st, data[off+walHeader:off+n]); err != nil {
			return st, off, fmt.Errorf("record at byte %d: %w", off, err)
		}
		off += n
	}
	return st, off, nil
}

// walRecordAt returns the size of the whole record at data[off:], ok false
// when none is there: a header cut short, a length out of bounds or running
// past the end, or a checksum that fails.
func walRecordAt(data []byte, off int) (int, bool) {
	rest := data[off:]
	if len(rest) < walHeader {
		return 0, false
	}
	l := int64(binary.BigEndian.Uint32(rest))
	if l < walMinPayload || l > walMaxRecord || walHeader+l > int64(len(rest)) {
		return 0, false
	}
	end := walHeader + int(l)
	if crc32.Checksum(rest[walHeader:end], walTable) != binary.BigEndian.Uint32(rest[4:]) {
		return 0, false
	}
	return end, true
}

// walNextRecord returns the offset of the first whole record at or after
// from, -1 if none. Only a damaged log makes it scan: a torn tail is at
// most one write long.
func walNextRecord(data []byte, from int) int {
	for off := from; off+walHeader+walMinPayload <= len(data); off++ {
		if _, ok := walRecordAt(data, off); ok {
			return off
		}
	}
	return -1
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
func walOpen(dir string) (lf *walFile, gen uint64, st walState, ok bool, err error) {
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
		return nil, 0, walState{}, false, fmt.Errorf("acceptor log %s: %w: %s", path, err, storStartAfresh)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0o600)
	if err != nil {
		return nil, 0, walState{}, false, fmt.Errorf("open acceptor log: %w", err)
	}
	lf = &walFile{f: f, end: int64(good), size: int64(len(data))}
	if good < len(data) && len(bytes.TrimLeft(data[good:], "\x00")) > 0 { // a torn tail
		if err := walCut(f, int64(good)); err != nil {
			_ = f.Close()
			return nil, 0, walState{}, false, err
		}
		lf.size = int64(good)
	}
	if err := lf.ahead(walZeroAhead / 2); err != nil {
		_ = f.Close()
		return nil, 0, walState{}, false, fmt.Errorf("open acceptor log: %w", err)
	}
	for _, old := range gens[:len(gens)-1] {
		if err := os.Remove(filepath.Join(dir, walName(old))); err != nil && !errors.Is(err, os.ErrNotExist) {
			_ = f.Close()
			return nil, 0, walState{}, false, fmt.Errorf("remove old acceptor log: %w", err)
		}
	}
	// The generation in use may have been renamed into place by a process
	// that crashed before it synced the dir.
	if err := storSyncDir(dir); err != nil {
		_ = f.Close()
		return nil, 0, walState{}, false, err
	}
	return lf, gen, st, true, nil
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
func walCreate(dir string, gen uint64, st walState) (*walFile, error) {
	slots := st.entries.slots()
	ents := make([][]byte, len(slots))
	for i, s := range slots {
		ents[i], _ = st.entries.get(s)
	}
	final := filepath.Join(dir, walName(gen))
	tmp := final + walTemp
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create acceptor log: %w", err)
	}
	fail := func(err error) (*walFile, error) {
		_ = f.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("create acceptor log: %w", err)
	}
	rec := walAppendRecord(nil, st.promised, st.commit, ents)
	if _, err := f.Write(rec); err != nil {
		return fail(err)
	}
	lf := &walFile{f: f, end: int64(len(rec)), size: int64(len(rec))}
	if err := lf.ahead(walZeroAhead / 2); err != nil { // syncs the record with the zeros
		return fail(err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fail(err)
	}
	if err := storSyncDir(dir); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("create acceptor log: %w", err)
	}
	return lf, nil
}

// walZeroAhead is how far past its last record a log file is filled with
// zeros when it is extended.
const walZeroAhead = 2 << 20

// walFile is the log file being appended to. Its end is extended with
// zeros written and fsynced ahead of the records (walZeroAhead at a time),
// and a record is written over them and made durable with fdatasync: the
// file's size and blocks do not change, so the sync flushes the record's
// data and no metadata (no journal commit). On this machine's disk that
// took an append from 0.54 to 0.33 ms (p50) and from 193 to 116 µs of
// CPU (docs/bench-log/paxos.md). PostgreSQL fills its WAL segments with zeros
// for the same reason. Replay stops at the first record that is not whole
// (the zeros are not); an open keeps the zeros and cuts off a torn record
// written over them.
type walFile struct {
	f    *os.File
	end  int64 // where the next record goes
	size int64 // the file's size: zeros from end to size
}

// ahead makes sure at least n bytes of zeros follow the end: when fewer
// do, it extends the file with zeros to walZeroAhead (or n) past the end
// and syncs it (the new size and blocks). A new or reopened log gets its
// zeros when it is opened (n = walZeroAhead/2), so the first appends (a
// campaign's promise, on the run loop) write none.
func (w *walFile) ahead(n int64) error {
	if w.size-w.end >= n {
		return nil
	}
	size := w.end + max(n, walZeroAhead)
	if _, err := w.f.WriteAt(make([]byte, size-w.size), w.size); err != nil {
		return err
	}
	if err := w.f.Sync(); err != nil {
		return err
	}
	w.size = size
	return nil
}

// append writes rec over the zeros at the end and syncs it.
func (w *walFile) append(rec []byte) error {
	if err := w.ahead(int64(len(rec))); err != nil {
		return err
	}
	if _, err := w.f.WriteAt(rec, w.end); err != nil {
		return err
	}
	if err := fileutil.Fdatasync(w.f); err != nil {
		return err
	}
	w.end += int64(len(rec))
	return nil
}

// Close closes the file.
func (w *walFile) Close() error { return w.f.Close() }
