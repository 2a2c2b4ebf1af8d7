package paxos

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/droverhq/drover/internal/varcodec"
)

// The table's snapshot layout. A busy group remembers hundreds of
// thousands of results (see tabledupe.go), and every snapshot holds them
// all: as JSON they took about a microsecond each to encode, so that a
// node at 400,000 spent 450 ms of CPU per snapshot, taken from the
// requests on a machine that runs the group's three nodes. Format 3 keeps
// the grants and lock-delays (a few per lock name) as JSON and the
// remembered results as varints and length-prefixed strings.
//
//	0x03                        format 3 (the JSON formats begin with '{')
//	uvarint n, n bytes          JSON: format, now, locks, delays
//	uvarint count               remembered results, oldest first, each:
//	  bytes ID, varint Time, uvarint FP, bytes Code, uvarint Index,
//	  bytes Err, byte Same, bytes Name, bytes Owner, uvarint Token,
//	  varint Acquired, varint Expires, bytes Meta

// tableSnapBinary is the first byte of a format-3 snapshot.
const tableSnapBinary = 3

// tableSeenMinBytes is the fewest bytes a remembered result takes in
// format 3: one per field.
const tableSeenMinBytes = 13

// tableSnapHead is a format-3 snapshot's JSON part.
type tableSnapHead struct {
	Format int         `json:"format"`
	Now    int64       `json:"now"`
	Locks  []LockState `json:"locks"`
	Delays []LockState `json:"delays"`
}

// encodeTableSnapshot encodes snap in format 3.
func encodeTableSnapshot(snap tableSnapshot) ([]byte, error) {
	head, err := json.Marshal(tableSnapHead{Format: tableSnapFormat, Now: snap.Now, Locks: snap.Locks, Delays: snap.Delays})
	if err != nil {
		return nil, err
	}
	parts, n := [][]byte(nil), len(snap.Seen)
	if snap.seenRaw != nil {
		parts, n = snap.seenRaw.parts, snap.seenRaw.n
	} else { // a decoded snapshot's results
		var p []byte
		for k := range snap.Seen {
			p = appendTableSeen(p, &snap.Seen[k])
		}
		parts = [][]byte{p}
	}
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	b := make([]byte, 0, 16+len(head)+size)
	b = append(b, tableSnapBinary)
	b = varcodec.AppendBytes(b, head)
	b = binary.AppendUvarint(b, uint64(n))
	for _, p := range parts {
		b = append(b, p...) // the log keeps results as format 3 does
	}
	return b, nil
}

// appendTableSeen appends s in format 3 to b.
func appendTableSeen(b []byte, s *tableSeen) []byte {
	str := func(b []byte, s string) []byte { return append(binary.AppendUvarint(b, uint64(len(s))), s...) }
	b = str(b, s.ID)
	b = binary.AppendVarint(b, s.Time)
	b = binary.AppendUvarint(b, s.FP)
	b = str(b, string(s.Code))
	b = binary.AppendUvarint(b, s.Index)
	b = str(b, s.Err)
	b = append(b, s.Same)
	b = str(b, s.Name)
	b = str(b, s.Owner)
	b = binary.AppendUvarint(b, s.Token)
	b = binary.AppendVarint(b, s.Acquired)
	b = binary.AppendVarint(b, s.Expires)
	return str(b, s.Meta)
}

// readTableSeen reads a result that appendTableSeen wrote.
func readTableSeen(d *varcodec.Reader) tableSeen {
	str := func() string { return string(d.Bytes()) }
	var s tableSeen
	s.ID = str()
	s.Time = d.Varint()
	s.FP = d.Uvarint()
	s.Code = Code(str())
	s.Index = d.Uvarint()
	s.Err = str()
	s.Same = d.Byte()
	s.Name = str()
	s.Owner = str()
	s.Token = d.Uvarint()
	s.Acquired = d.Varint()
	s.Expires = d.Varint()
	s.Meta = str()
	return s
}

// decodeTableSeen decodes the result that raw begins with (a seenLog's,
// written by appendTableSeen) and returns the bytes after it.
func decodeTableSeen(raw []byte) (tableSeen, []byte) {
	d := varcodec.NewReader(raw)
	s := readTableSeen(d)
	return s, raw[len(raw)-d.Len():]
}

// decodeTableSnapshot reads a snapshot of any format this build knows:
// 3, or the JSON formats 1 and 2.
func decodeTableSnapshot(data []byte) (tableSnapshot, error) {
	var snap tableSnapshot
	switch {
	case len(data) == 0:
		return snap, fmt.Errorf("empty snapshot")
	case data[0] == '{':
		if err := json.Unmarshal(data, &snap); err != nil {
			return snap, err
		}
		switch snap.Format {
		case 2:
		case 1: // its seen entries have another layout
			var v1 tableSnapshotV1
			if err := json.Unmarshal(data, &v1); err != nil {
				return snap, err
			}
			snap.Seen = v1.upgrade()
		default:
			return snap, fmt.Errorf("unknown JSON snapshot format %d (this build reads JSON formats 1 and 2, and format %d)", snap.Format, tableSnapFormat)
		}
		return snap, nil
	case data[0] != tableSnapBinary:
		return snap, fmt.Errorf("unknown snapshot format (first byte %#x; this build reads formats 1 to %d)", data[0], tableSnapFormat)
	}
	d := varcodec.NewReader(data[1:])
	var head tableSnapHead
	if err := json.Unmarshal(d.Bytes(), &head); d.Err() != nil || err != nil {
		return snap, fmt.Errorf("format 3 head: %w", firstErr(d.Err(), err))
	}
	if head.Format != tableSnapBinary {
		return snap, fmt.Errorf("format 3 head says format %d", head.Format)
	}
	snap.Format, snap.Now, snap.Locks, snap.Delays = head.Format, head.Now, head.Locks, head.Delays
	n := d.Count()
	// A damaged count must not reserve gigabytes: every result takes
	// tableSeenMinBytes at least.
	snap.Seen = make([]tableSeen, 0, min(n, d.Len()/tableSeenMinBytes))
	for i := 0; i < n && d.Err() == nil; i++ {
		snap.Seen = append(snap.Seen, readTableSeen(d))
	}
	switch {
	case d.Err() != nil:
		return snap, fmt.Errorf("format 3 remembered results: %w", d.Err())
	case d.Len() != 0:
		return snap, fmt.Errorf("format 3: %d bytes after the remembered results", d.Len())
	}
	return snap, nil
}

// firstErr is the first of errs that is not nil.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
