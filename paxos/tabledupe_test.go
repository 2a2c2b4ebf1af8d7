package paxos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTableRepeatGetsTheFirstResultExactly: the memory leaves out what the
// request gives back; a repeat (before and after a snapshot) must still
// get the first result field for field, whatever the op and outcome.
func TestTableRepeatGetsTheFirstResultExactly(t *testing.T) {
	meta := `{"id":"w-7","host":"h","pid":42}`
	cmds := []Command{
		{Op: OpAcquire, ID: "a1", Lock: "a", Owner: "o1", TTL: 5000, Meta: meta, Time: 1000},
		{Op: OpAcquire, ID: "a2", Lock: "a", Owner: "o2", TTL: 5000, Time: 1001},                  // held
		{Op: OpRenew, ID: "r1", Lock: "a", Owner: "o1", Token: 1, TTL: 9000, Time: 1002},          // renewed
		{Op: OpRenew, ID: "r2", Lock: "a", Owner: "o2", Token: 1, TTL: 9000, Time: 1003},          // not held
		{Op: OpRelease, ID: "d1", Lock: "a", Owner: "o2", Token: 1, Time: 1004},                   // not held
		{Op: OpRelease, ID: "d2", Lock: "a", Owner: "o1", Token: 1, Time: 1005},                   // released
		{Op: OpRelease, ID: "d3", Lock: "a", Owner: "o1", Token: 1, Time: 1006},                   // free
		{Op: OpAcquire, ID: "a3", Lock: "b", Owner: "o1", TTL: 0, Time: 1007},                     // expires at once
		{Op: OpAddNode, ID: "m1", Node: 4, Addr: "127.0.0.1:1", Time: 1008},                       // a change
		{Op: "explode", ID: "x1", Lock: "a", Time: 1009},                                          // rejected
		{Op: OpAcquire, ID: "a4", Lock: "a", Owner: "o1", TTL: 100, Meta: meta + " ", Time: 1010}, // granted
	}
	tb := NewTable(0)
	first := map[string]Result{}
	for i, c := range cmds {
		first[c.ID] = tb.Apply(uint64(i+1), c)
	}
	tb.rememberResult("m1", Result{Code: CodeRejected, Err: "node 4 is already a member", Index: 9})
	first["m1"] = Result{Code: CodeRejected, Err: "node 4 is already a member", Index: 9}
	snap, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	restored := NewTable(0)
	if err := restored.Restore(snap); err != nil {
		t.Fatal(err)
	}
	for name, tbl := range map[string]*Table{"live": tb, "restored": restored} {
		for i, c := range cmds {
			c.Time += 50_000 // a retry, later, maybe stamped by another leader
			c.LockDelay = 7
			if got := tbl.Apply(uint64(100+i), c); !reflect.DeepEqual(got, first[c.ID]) {
				t.Errorf("%s: repeat of %s = %+v, want the first result %+v", name, c.ID, got, first[c.ID])
			}
		}
	}
}

// TestTableReusedIDForAnotherRequest: an ID applied before, sent with
// another request, gets CodeReusedID and changes nothing; the first
// request's repeats still get their result.
func TestTableReusedIDForAnotherRequest(t *testing.T) {
	base := Command{Op: OpRelease, ID: "k", Lock: "a", Owner: "o1", Token: 1, Time: 1000}
	tb := NewTable(0)
	tb.Apply(1, tblAcquire("a", "o1", 900, 5000))
	want := tb.Apply(2, base)
	if want.Code != CodeNotHeld && want.Code != CodeOK {
		t.Fatalf("release = %+v", want)
	}
	edits := map[string]func(*Command){
		"op":     func(c *Command) { c.Op = OpAcquire; c.TTL = 5000 },
		"lock":   func(c *Command) { c.Lock = "b" },
		"owner":  func(c *Command) { c.Owner = "o2" },
		"token":  func(c *Command) { c.Token = 2 },
		"ttl":    func(c *Command) { c.TTL = 1 },
		"holder": func(c *Command) { c.Meta = "{}" },
		"member": func(c *Command) { c.Node = 3 },
		"addr":   func(c *Command) { c.Addr = "h:1" },
	}
	slot := uint64(3)
	for what, edit := range edits {
		c := base
		edit(&c)
		got := tb.Apply(slot, c)
		slot++
		if got.Code != CodeReusedID || got.Index != 2 || !strings.Contains(got.Err, `command id "k" was used for a different request`) {
			t.Errorf("ID reused with another %s: %+v, want %s naming slot 2", what, got, CodeReusedID)
		}
	}
	if r := tb.Apply(slot, tblGet("a", 1001)); r.Code != CodeNotFound {
		t.Fatalf("a reused ID changed the table: %+v", r)
	}
	if got := tb.Apply(slot+1, base); !reflect.DeepEqual(got, want) {
		t.Fatalf("repeat of the first request = %+v, want %+v", got, want)
	}
}

// TestTableRestoresFormat1: a snapshot written before the memory was
// compact (format 1) restores; its IDs have no fingerprint, so any
// request with one gets its first result, as before.
func TestTableRestoresFormat1(t *testing.T) {
	res := Result{Code: CodeOK, Index: 7, Lock: LockState{Name: "a", Owner: "o", Token: 7, Acquired: 1000, Expires: 6000, Meta: "{}"}}
	v1, err := json.Marshal(map[string]any{
		"format": 1, "now": 1000,
		"locks": []LockState{res.Lock}, "delays": []LockState{},
		"seen": []tableSeenV1{{ID: "old", Time: 1000, Result: res}},
	})
	if err != nil {
		t.Fatal(err)
	}
	tb := NewTable(0)
	if err := tb.Restore(v1); err != nil {
		t.Fatal(err)
	}
	if got := tb.Apply(8, Command{Op: OpAcquire, ID: "old", Lock: "zz", Owner: "p", TTL: 1, Time: 1001}); !reflect.DeepEqual(got, res) {
		t.Fatalf("format-1 ID = %+v, want its first result %+v", got, res)
	}
	if got := tb.Apply(9, tblGet("a", 1002)); got.Code != CodeOK || got.Lock != res.Lock {
		t.Fatalf("format-1 lock = %+v", got)
	}
}

// TestTableMemoryIsCompact bounds the snapshot bytes per remembered ID
// for the writes paxoslock.New makes (a 37-byte key, its owner and holder
// record): before the memory was compact they were about 417 (acquire,
// renew) and 187 (release).
func TestTableMemoryIsCompact(t *testing.T) {
	meta := `{"id":"worker-7.example.internal:4242","host":"worker-7.example.internal","pid":4242,"acquired_at":"2026-11-23T09:27:52.123456789Z"}`
	owner := "worker-7.example.internal:4242#0123456789abcdef"
	per := func(op Op) float64 {
		tb := NewTable(0)
		now := int64(1795424738330)
		const n = 500
		for i := range n {
			lock := fmt.Sprintf("drover:report-%d", i)
			acq := Command{Op: OpAcquire, Lock: lock, Owner: owner, TTL: 15000, Meta: meta, Time: now}
			r := tb.Apply(uint64(2*i+1), acq)
			c := Command{Op: op, ID: fmt.Sprintf("http:%032x", i), Lock: lock, Owner: owner, Token: r.Lock.Token, TTL: 15000, Meta: meta, Time: now + 1}
			if op != OpAcquire {
				c.Meta = ""
			} else {
				tb.Apply(uint64(2*i+1)+0, Command{Op: OpRelease, Lock: lock, Owner: owner, Token: r.Lock.Token, Time: now})
			}
			if op == OpRelease {
				c.TTL = 0
			}
			tb.Apply(uint64(2*i+2), c)
			now += 2
		}
		tb.mu.Lock()
		defer tb.mu.Unlock()
		b, err := json.Marshal(tb.seenList())
		if err != nil {
			t.Fatal(err)
		}
		return float64(len(b)) / n
	}
	for op, limit := range map[Op]float64{OpAcquire: 130, OpRelease: 130, OpRenew: 290} {
		got := per(op)
		t.Logf("%s: %.1f snapshot bytes per remembered id", op, got)
		if got > limit {
			t.Errorf("%s: %.1f bytes per remembered id, want at most %.0f", op, got, limit)
		}
	}
}

// TestTableSnapshotFormat3: the binary snapshot restores to a table that
// snapshots to the same bytes and answers repeats alike; the JSON format 2
// of the same table restores to it too; every cut of the bytes and a byte
// past the end are refused, leaving the table as it was.
func TestTableSnapshotFormat3(t *testing.T) {
	tb := NewTable(time.Second)
	cmds := tblRandomCommands(5, 3000)
	for i, c := range cmds {
		tb.Apply(uint64(i+1), c)
	}
	snap, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if snap[0] != tableSnapBinary {
		t.Fatalf("snapshot begins with %#x, want format 3", snap[0])
	}
	decoded, err := decodeTableSnapshot(snap)
	if err != nil || len(decoded.Seen) == 0 {
		t.Fatalf("decode: %v (%d remembered)", err, len(decoded.Seen))
	}
	if want := tb.seenList(); !reflect.DeepEqual(decoded.Seen, want) {
		t.Fatal("the decoded remembered results differ from the table's")
	}
	v2 := decoded
	v2.Format = 2
	asJSON, err := json.Marshal(v2)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"format 3": snap, "format 2": asJSON} {
		restored := NewTable(0)
		if err := restored.Restore(data); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if again, _ := restored.Snapshot(); !bytes.Equal(again, snap) {
			t.Fatalf("%s: the restored table snapshots to other bytes", name)
		}
		for i, c := range cmds[len(cmds)-50:] { // repeats get their first answers
			if c.ID == "" {
				continue
			}
			want, got := tb.Apply(uint64(5000+i), c), restored.Apply(uint64(5000+i), c)
			if !reflect.DeepEqual(want, got) {
				t.Fatalf("%s: repeat of %s answered %+v, want %+v", name, c.ID, got, want)
			}
		}
	}
	keep := NewTable(0)
	keep.Apply(1, tblAcquire("a", "o", 1000, 5000))
	before, _ := keep.Snapshot()
	for cut := 1; cut < len(snap); cut += max(1, len(snap)/500) {
		if err := keep.Restore(snap[:cut]); err == nil {
			t.Fatalf("a snapshot cut at byte %d of %d was restored", cut, len(snap))
		}
	}
	if err := keep.Restore(append(slices.Clone(snap), 0)); err == nil {
		t.Fatal("a snapshot with a byte past its end was restored")
	}
	if after, _ := keep.Snapshot(); !bytes.Equal(after, before) {
		t.Fatal("a refused Restore changed the table")
	}
}

// TestTableSnapshotFormat3EveryField: a remembered result with every field
// set (none zero) decodes field for field, so that a field left out of
// both the encoder and the decoder is caught.
func TestTableSnapshotFormat3EveryField(t *testing.T) {
	full := tableSeen{ID: "id-1", Time: 1_795_424_738_330, FP: 1<<63 + 5, Code: CodeHeld, Index: 1 << 40, Err: "err",
		Same: 0x7f, Name: "lock", Owner: "owner", Token: 1<<33 + 1, Acquired: -7, Expires: 1 << 50, Meta: `{"pid":1}`}
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("field %s of the sample is zero: set it", v.Type().Field(i).Name)
		}
	}
	data, err := encodeTableSnapshot(tableSnapshot{Now: 9, Seen: []tableSeen{full}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeTableSnapshot(data)
	if err != nil || len(got.Seen) != 1 || !reflect.DeepEqual(got.Seen[0], full) {
		t.Fatalf("decoded %+v (%v), want %+v", got.Seen, err, full)
	}
}
