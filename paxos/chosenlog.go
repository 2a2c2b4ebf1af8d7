package paxos

import (
	"encoding/binary"
	"fmt"

	"github.com/droverhq/drover/internal/varcodec"
)

// chosenLog is the applied part of a node's log: the chosen entries from
// slot first on, with no gap, kept for catch-ups (a peer behind is sent
// them rather than the snapshot) until a snapshot's cut drops them (or a
// snapshot installed from a peer replaces them all). A busy
// node keeps a quarter of its table's items of them and more (see
// takeSnapshot and trailing): at 1,800 cycles/s, over a hundred thousand.
// As Entry values in a map they were, with the acceptor log's copy of the
// same entries, most of what the garbage collector marked (see byteLog);
// here each is encoded (appendEntry) in a byteLog. The entries not yet
// applied, which the protocol reads and rewrites, stay in the node's map.
//
// The zero value is empty.
type chosenLog struct {
	raw   byteLog
	first uint64 // the slot of the oldest entry kept, when any
}

// len is how many entries the log keeps.
func (c *chosenLog) len() int { return c.raw.n }

// push appends e, applied after the last. An entry that does not follow
// the last starts the log afresh at it, so that the log never has a gap.
func (c *chosenLog) push(e Entry) {
	if c.raw.n == 0 || e.Slot != c.first+uint64(c.raw.n) {
		c.raw, c.first = byteLog{}, e.Slot
	}
	b := c.raw.next()
	*b = appendEntry(*b, &e)
}

// has reports whether the entry at slot is kept.
func (c *chosenLog) has(slot uint64) bool {
	return c.raw.n > 0 && slot >= c.first && slot-c.first < uint64(c.raw.n)
}

// get is the entry at slot, if kept. An entry that does not decode is a
// bug (the log encoded it), never a value to leave out of a Promise: it
// panics.
func (c *chosenLog) get(slot uint64) (Entry, bool) {
	if !c.has(slot) {
		return Entry{}, false
	}
	e, err := decodeEntry(c.raw.at(int(slot - c.first)))
	if err != nil {
		panic(fmt.Sprintf("paxos: the chosen log's entry at slot %d: %v", slot, err))
	}
	return e, true
}

// dropThrough forgets the entries at and below slot.
func (c *chosenLog) dropThrough(slot uint64) {
	if c.raw.n == 0 || slot < c.first {
		return
	}
	k := min(slot-c.first+1, uint64(c.raw.n))
	c.raw.drop(int(k))
	c.first += k
}

// appendEntry appends e's binary encoding to b: uvarints Slot, Round,
// Node, then the command (appendCommand).
func appendEntry(b []byte, e *Entry) []byte {
	b = binary.AppendUvarint(b, e.Slot)
	b = binary.AppendUvarint(b, e.Ballot.Round)
	b = binary.AppendUvarint(b, uint64(e.Ballot.Node))
	return appendCommand(b, &e.Cmd)
}

// appendCommand appends c's binary encoding to b: its fields in order of
// declaration, strings as a uvarint length and bytes, Time, LockDelay and
// TTL as varints, Token and Node as uvarints.
func appendCommand(b []byte, c *Command) []byte {
	str := func(b []byte, s string) []byte { return append(binary.AppendUvarint(b, uint64(len(s))), s...) }
	b = str(b, string(c.Op))
	b = str(b, c.ID)
	b = binary.AppendVarint(b, c.Time)
	b = binary.AppendVarint(b, c.LockDelay)
	b = str(b, c.Lock)
	b = str(b, c.Owner)
	b = binary.AppendVarint(b, c.TTL)
	b = binary.AppendUvarint(b, c.Token)
	b = binary.AppendUvarint(b, uint64(c.Node))
	b = str(b, c.Addr)
	return str(b, c.Meta)
}

// decodeEntry reads what appendEntry wrote, and nothing after it.
func decodeEntry(raw []byte) (Entry, error) {
	d := varcodec.NewReader(raw)
	e := Entry{Slot: d.Uvarint(), Ballot: Ballot{Round: d.Uvarint(), Node: NodeID(d.Uvarint())}}
	c := &e.Cmd
	c.Op = Op(d.Bytes())
	c.ID = string(d.Bytes())
	c.Time, c.LockDelay = d.Varint(), d.Varint()
	c.Lock, c.Owner = string(d.Bytes()), string(d.Bytes())
	c.TTL, c.Token, c.Node = d.Varint(), d.Uvarint(), NodeID(d.Uvarint())
	c.Addr, c.Meta = string(d.Bytes()), string(d.Bytes())
	switch {
	case d.Err() != nil:
		return Entry{}, fmt.Errorf("decode entry: %w", d.Err())
	case d.Len() != 0:
		return Entry{}, fmt.Errorf("decode entry: %d bytes after it", d.Len())
	}
	return e, nil
}
