package paxos

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// tblStep is one command applied at a slot and the result expected.
type tblStep struct {
	slot uint64
	cmd  Command
	want Result
}

// tblRun applies steps in order to tb and checks every result.
func tblRun(t *testing.T, tb *Table, steps []tblStep) {
	t.Helper()
	for i, s := range steps {
		got := tb.Apply(s.slot, s.cmd)
		s.want.Index = s.slot
		if !reflect.DeepEqual(got, s.want) {
			t.Fatalf("step %d: Apply(%d, %+v) =\n%+v\nwant\n%+v", i, s.slot, s.cmd, got, s.want)
		}
	}
}

// Commands for the table tests; times are Unix ms.
func tblAcquire(lock, owner string, at, ttl int64) Command {
	return Command{Op: OpAcquire, Lock: lock, Owner: owner, Time: at, TTL: ttl}
}
func tblRelease(lock, owner string, token uint64, at int64) Command {
	return Command{Op: OpRelease, Lock: lock, Owner: owner, Token: token, Time: at}
}
func tblRenew(lock, owner string, token uint64, at, ttl int64) Command {
	return Command{Op: OpRenew, Lock: lock, Owner: owner, Token: token, Time: at, TTL: ttl}
}
func tblGet(lock string, at int64) Command { return Command{Op: OpGet, Lock: lock, Time: at} }

// tblHeld is a LockState granted at slot token.
func tblHeld(lock, owner string, token uint64, acquired, expires int64) LockState {
	return LockState{Name: lock, Owner: owner, Token: token, Acquired: acquired, Expires: expires}
}

// tblCase is a named sequence of steps on a fresh table.
type tblCase struct {
	name  string
	steps []tblStep
}

// tblRunCases runs each case as a subtest on a fresh table with lockDelay.
func tblRunCases(t *testing.T, lockDelay time.Duration, cases []tblCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tblRun(t, NewTable(lockDelay), tc.steps)
		})
	}
}

// tblFree is the state of a lock nobody holds.
func tblFree(lock string) LockState { return LockState{Name: lock} }

// tblA is lock "a" granted to o1 at slot 1, time 1000, for 5 s.
var tblA = tblHeld("a", "o1", 1, 1000, 6000)

func TestTableAcquire(t *testing.T) {
	tblRunCases(t, 0, []tblCase{
		{name: "acquire free lock", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
		}},
		{name: "acquire keeps meta", steps: []tblStep{
			{1, Command{Op: OpAcquire, Lock: "a", Owner: "o1", Time: 1000, TTL: 5000, Meta: `{"h":1}`},
				Result{Code: CodeOK, Lock: LockState{Name: "a", Owner: "o1", Token: 1, Acquired: 1000, Expires: 6000, Meta: `{"h":1}`}}},
		}},
		{name: "acquire held by other", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblAcquire("a", "o2", 2000, 5000), Result{Code: CodeHeld, Lock: tblA}},
		}},
		{name: "acquire held by same owner", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblAcquire("a", "o1", 2000, 5000), Result{Code: CodeHeld, Lock: tblA}},
		}},
		{name: "acquire at expiry", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblAcquire("a", "o2", 6000, 100), Result{Code: CodeOK, Lock: tblHeld("a", "o2", 2, 6000, 6100)}},
		}},
	})
}

func TestTableRelease(t *testing.T) {
	tblRunCases(t, 0, []tblCase{
		{name: "release by holder", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblRelease("a", "o1", 1, 2000), Result{Code: CodeOK, Lock: tblFree("a")}},
			{3, tblGet("a", 2001), Result{Code: CodeNotFound, Lock: tblFree("a")}},
			{4, tblAcquire("a", "o2", 2002, 10), Result{Code: CodeOK, Lock: tblHeld("a", "o2", 4, 2002, 2012)}},
		}},
		{name: "release wrong token", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblRelease("a", "o1", 7, 2000), Result{Code: CodeNotHeld, Lock: tblA}},
			{3, tblGet("a", 2001), Result{Code: CodeOK, Lock: tblA}},
		}},
		{name: "release wrong owner", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblRelease("a", "o2", 1, 2000), Result{Code: CodeNotHeld, Lock: tblA}},
		}},
		{name: "release free lock", steps: []tblStep{
			{1, tblRelease("a", "o1", 1, 2000), Result{Code: CodeNotHeld, Lock: tblFree("a")}},
		}},
		{name: "release after expiry", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblRelease("a", "o1", 1, 6000), Result{Code: CodeNotHeld, Lock: tblFree("a")}},
		}},
	})
}

func TestTableRenew(t *testing.T) {
	tblRunCases(t, 0, []tblCase{})
}

func TestTableGetList(t *testing.T) {
	tblRunCases(t, 0, []tblCase{
		{name: "get held and expired", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblGet("a", 5999), Result{Code: CodeOK, Lock: tblA}},
			{3, tblGet("a", 6000), Result{Code: CodeNotFound, Lock: tblFree("a")}},
		}},
		{name: "list sorted and unexpired only", steps: []tblStep{
			{1, tblAcquire("c", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblHeld("c", "o1", 1, 1000, 6000)}},
			{2, tblAcquire("a", "o2", 1000, 5000), Result{Code: CodeOK, Lock: tblHeld("a", "o2", 2, 1000, 6000)}},
			{3, tblAcquire("b", "o3", 1000, 100), Result{Code: CodeOK, Lock: tblHeld("b", "o3", 3, 1000, 1100)}},
			{4, Command{Op: OpList, Time: 2000}, Result{Code: CodeOK,
				Locks: []LockState{tblHeld("a", "o2", 2, 1000, 6000), tblHeld("c", "o1", 1, 1000, 6000)}}},
		}},
		{name: "list empty", steps: []tblStep{
			{1, Command{Op: OpList, Time: 2000}, Result{Code: CodeOK}},
		}},
	})
}

func TestTableTickNoop(t *testing.T) {
	tblRunCases(t, 0, []tblCase{
		{name: "tblRenew by holder", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblRenew("a", "o1", 1, 5999, 5000), Result{Code: CodeOK, Lock: tblHeld("a", "o1", 1, 1000, 10999)}},
			{3, tblGet("a", 10998), Result{Code: CodeOK, Lock: tblHeld("a", "o1", 1, 1000, 10999)}},
		}},
		{name: "tblRenew past expiry refused", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblRenew("a", "o1", 1, 6000, 5000), Result{Code: CodeNotHeld, Lock: tblFree("a")}},
			{3, tblGet("a", 6001), Result{Code: CodeNotFound, Lock: tblFree("a")}},
		}},
		{name: "tblRenew wrong token", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblRenew("a", "o1", 2, 2000, 5000), Result{Code: CodeNotHeld, Lock: tblA}},
		}},
		{name: "tick frees expired", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblAcquire("b", "o1", 1000, 9000), Result{Code: CodeOK, Lock: tblHeld("b", "o1", 2, 1000, 10000)}},
			{3, Command{Op: OpTick, Time: 6000}, Result{Code: CodeOK}},
			{4, Command{Op: OpList, Time: 6000}, Result{Code: CodeOK, Locks: []LockState{tblHeld("b", "o1", 2, 1000, 10000)}}},
			{5, tblAcquire("a", "o2", 6001, 10), Result{Code: CodeOK, Lock: tblHeld("a", "o2", 5, 6001, 6011)}},
		}},
		{name: "noop and membership change nothing", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, Command{Op: OpNoop, Time: 1001}, Result{Code: CodeOK}},
			{3, Command{Op: OpAddNode, Node: 3, Addr: "127.0.0.1:7103", Time: 1002}, Result{Code: CodeOK}},
			{4, Command{Op: OpRemoveNode, Node: 3, Time: 1003}, Result{Code: CodeOK}},
			{5, tblGet("a", 1004), Result{Code: CodeOK, Lock: tblA}},
		}},
		{name: "unknown op rejected", steps: []tblStep{
			{1, Command{Op: "explode", Lock: "a", Time: 1000}, Result{Code: CodeRejected, Err: `unknown op "explode"`}},
		}},
	})
}

func TestTableFencingTokensAreSlots(t *testing.T) {
	tb := NewTable(0)
	var last uint64
	now := int64(1000)
	slot := uint64(0)
	for i := range 50 {
		slot += uint64(1 + i%3)
		r := tb.Apply(slot, tblAcquire("x", fmt.Sprintf("o%d", i), now, 100))
		if r.Code != CodeOK || r.Lock.Token != slot {
			t.Fatalf("grant %d at slot %d: %+v, want token %d", i, slot, r, slot)
		}
		if r.Lock.Token <= last {
			t.Fatalf("token %d not above previous %d", r.Lock.Token, last)
		}
		last = r.Lock.Token
		// Alternate a release and an expiry to free the lock.
		if i%2 == 0 {
			slot++
			if r := tb.Apply(slot, tblRelease("x", r.Lock.Owner, r.Lock.Token, now+1)); r.Code != CodeOK {
				t.Fatalf("release: %+v", r)
			}
			now += 2
		} else {
			now += 100
		}
	}
}

// tblDelay is cmd as a leader with lock-delay ms stamps it.
func tblDelay(ms int64, cmd Command) Command {
	cmd.LockDelay = ms
	return cmd
}

func TestTableLockDelay(t *testing.T) {
	const delay = 2000
	blocked := tblA
	blocked.Expires = 8000 // expiry + lock-delay
	tblRunCases(t, 0, []tblCase{
		{name: "expiry blocks until delay ends", steps: []tblStep{
			{1, tblDelay(delay, tblAcquire("a", "o1", 1000, 5000)), Result{Code: CodeOK, Lock: tblA}},
			{2, tblDelay(delay, tblAcquire("a", "o2", 6000, 1000)), Result{Code: CodeHeld, Lock: blocked}},
			{3, tblDelay(delay, tblAcquire("a", "o1", 7999, 1000)), Result{Code: CodeHeld, Lock: blocked}},
			{4, tblDelay(delay, tblGet("a", 7000)), Result{Code: CodeNotFound, Lock: LockState{Name: "a"}}},
			{5, tblDelay(delay, tblAcquire("a", "o2", 8000, 1000)), Result{Code: CodeOK, Lock: tblHeld("a", "o2", 5, 8000, 9000)}},
		}},
		{name: "delay survives tick", steps: []tblStep{
			{1, tblDelay(delay, tblAcquire("a", "o1", 1000, 5000)), Result{Code: CodeOK, Lock: tblA}},
			{2, tblDelay(delay, Command{Op: OpTick, Time: 6500}), Result{Code: CodeOK}},
			{3, tblDelay(delay, tblAcquire("a", "o2", 7000, 1000)), Result{Code: CodeHeld, Lock: blocked}},
			{4, tblDelay(delay, Command{Op: OpTick, Time: 8000}), Result{Code: CodeOK}},
			{5, tblDelay(delay, tblAcquire("a", "o2", 8000, 1000)), Result{Code: CodeOK, Lock: tblHeld("a", "o2", 5, 8000, 9000)}},
		}},
		{name: "release starts no delay", steps: []tblStep{
			{1, tblDelay(delay, tblAcquire("a", "o1", 1000, 5000)), Result{Code: CodeOK, Lock: tblA}},
			{2, tblDelay(delay, tblRelease("a", "o1", 1, 2000)), Result{Code: CodeOK, Lock: LockState{Name: "a"}}},
			{3, tblDelay(delay, tblAcquire("a", "o2", 2000, 1000)), Result{Code: CodeOK, Lock: tblHeld("a", "o2", 3, 2000, 3000)}},
		}},
	})
	// The delay is the command's, never the table's own: NewTable's
	// argument is not used.
	tblRunCases(t, time.Hour, []tblCase{
		{name: "no stamp, no delay", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblAcquire("a", "o2", 6000, 1000), Result{Code: CodeOK, Lock: tblHeld("a", "o2", 2, 6000, 7000)}},
		}},
		{name: "the tick's stamp starts the delay", steps: []tblStep{
			{1, tblAcquire("a", "o1", 1000, 5000), Result{Code: CodeOK, Lock: tblA}},
			{2, tblDelay(delay, Command{Op: OpTick, Time: 6500}), Result{Code: CodeOK}},
			{3, tblAcquire("a", "o2", 7000, 1000), Result{Code: CodeHeld, Lock: blocked}},
		}},
	})
}

func TestTableNextExpiry(t *testing.T) {
	tb := NewTable(0)
	if got := tb.NextExpiry(); got != 0 {
		t.Fatalf("empty table NextExpiry = %d, want 0", got)
	}
	tb.Apply(1, tblAcquire("a", "o", 1000, 5000))
	tb.Apply(2, tblAcquire("b", "o", 1000, 3000))
	if got := tb.NextExpiry(); got != 4000 {
		t.Fatalf("NextExpiry = %d, want 4000 (b's expiry)", got)
	}
	tb.Apply(3, tblRenew("b", "o", 2, 2000, 9000))
	if got := tb.NextExpiry(); got != 6000 {
		t.Fatalf("after renewing b, NextExpiry = %d, want 6000 (a's expiry)", got)
	}
	tb.Apply(4, Command{Op: OpTick, Time: 6000, LockDelay: 1000})
	if got := tb.NextExpiry(); got != 7000 {
		t.Fatalf("after tick, NextExpiry = %d, want 7000 (a's lock-delay end)", got)
	}
	tb.Apply(5, Command{Op: OpTick, Time: 7000})
	if got := tb.NextExpiry(); got != 11000 {
		t.Fatalf("after delay ended, NextExpiry = %d, want 11000 (b's expiry)", got)
	}
	if got := tb.Now(); got != 7000 {
		t.Fatalf("Now = %d, want 7000", got)
	}
}

func TestTableDedupe(t *testing.T) {
	window := DedupeWindow.Milliseconds()
	tb := NewTable(0)
	first := tb.Apply(1, Command{Op: OpAcquire, ID: "req-1", Lock: "a", Owner: "o1", Time: 1000, TTL: 5000})
	if first.Code != CodeOK || first.Index != 1 {
		t.Fatalf("first apply: %+v", first)
	}
	tb.Apply(2, tblRelease("a", "o1", 1, 1500))
	// The same command again: the first result, index included, and the
	// lock is not granted a second time.
	again := tb.Apply(3, Command{Op: OpAcquire, ID: "req-1", Lock: "a", Owner: "o1", Time: 2000, TTL: 5000})
	if !reflect.DeepEqual(again, first) {
		t.Fatalf("duplicate = %+v, want first result %+v", again, first)
	}
	if r := tb.Apply(4, tblGet("a", 2001)); r.Code != CodeNotFound {
		t.Fatalf("duplicate acquire was applied: %+v", r)
	}
	// Survives a snapshot.
	snap, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	tb2 := NewTable(0)
	if err := tb2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if r := tb2.Apply(5, Command{Op: OpAcquire, ID: "req-1", Lock: "a", Owner: "o1", Time: 1000 + window - 1, TTL: 5000}); !reflect.DeepEqual(r, first) {
		t.Fatalf("duplicate after restore = %+v, want %+v", r, first)
	}
	// Forgotten once the window has passed: applied afresh.
	r := tb2.Apply(6, Command{Op: OpAcquire, ID: "req-1", Lock: "a", Owner: "o1", Time: 1000 + window, TTL: 10})
	if r.Code != CodeOK || r.Index != 6 || r.Lock.Token != 6 {
		t.Fatalf("after the window = %+v, want a fresh grant at 6", r)
	}
}

func TestTableReadsNotRemembered(t *testing.T) {
	tb := NewTable(0)
	if r := tb.Apply(1, Command{Op: OpGet, ID: "g", Lock: "a", Time: 1000}); r.Code != CodeNotFound {
		t.Fatalf("get: %+v", r)
	}
	tb.Apply(2, tblAcquire("a", "o", 1001, 100))
	if r := tb.Apply(3, Command{Op: OpGet, ID: "g", Lock: "a", Time: 1002}); r.Code != CodeOK || r.Index != 3 {
		t.Fatalf("repeated get = %+v, want the current holder at index 3", r)
	}
}

// tblRandomCommands returns n commands over a few locks and owners, with
// duplicates, times that sometimes run backwards, and odd values.
func tblRandomCommands(seed uint64, n int) []Command {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ops := []Op{OpAcquire, OpAcquire, OpRelease, OpRenew, OpGet, OpList, OpTick, OpNoop}
	var cmds []Command
	now := int64(1_000_000)
	for i := range n {
		now += rng.Int64N(400) - 20
		c := Command{
			Op:    ops[rng.IntN(len(ops))],
			ID:    fmt.Sprintf("id%d", rng.IntN(n)),
			Time:  now,
			Lock:  fmt.Sprintf("lock-%d", rng.IntN(8)),
			Owner: fmt.Sprintf("owner-%d", rng.IntN(4)),
			TTL:   rng.Int64N(3000) - 100,
			Token: uint64(rng.IntN(i + 1)),
			Meta:  fmt.Sprintf(`{"n":%d}`, i%3),
			// The leader's lock-delay: it changes with leaders.
			LockDelay: []int64{0, 500, 2000}[rng.IntN(3)],
		}
		if rng.IntN(10) == 0 {
			c.ID = ""
		}
		cmds = append(cmds, c)
	}
	return cmds
}

func TestTableDeterminism(t *testing.T) {
	cmds := tblRandomCommands(42, 5000)
	a, b := NewTable(500*time.Millisecond), NewTable(500*time.Millisecond)
	granted := 0
	for i, c := range cmds {
		ra, rb := a.Apply(uint64(i+1), c), b.Apply(uint64(i+1), c)
		if !reflect.DeepEqual(ra, rb) {
			t.Fatalf("command %d (%+v): results differ:\n%+v\n%+v", i, c, ra, rb)
		}
		if c.Op == OpAcquire && ra.Code == CodeOK && ra.Index == uint64(i+1) {
			granted++
		}
		if a.NextExpiry() != b.NextExpiry() || a.Now() != b.Now() {
			t.Fatalf("command %d: NextExpiry or Now differ", i)
		}
	}
	if granted == 0 {
		t.Fatal("no acquire succeeded: the commands exercise nothing")
	}
	sa, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sa, sb) {
		t.Fatal("snapshots of tables fed the same commands differ")
	}
}

func TestTableSnapshotRoundTrip(t *testing.T) {
	cmds := tblRandomCommands(7, 4000)
	orig := NewTable(time.Second)
	for i, c := range cmds[:2000] {
		orig.Apply(uint64(i+1), c)
	}
	snap, err := orig.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	restored := NewTable(time.Second)
	restored.Apply(1, tblAcquire("stale", "o", 1, 1_000_000_000)) // replaced by Restore
	if err := restored.Restore(snap); err != nil {
		t.Fatal(err)
	}
	again, err := restored.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snap, again) {
		t.Fatalf("snapshot of the restored table differs:\n%q\n%q", snap, again)
	}
	if orig.Now() != restored.Now() || orig.NextExpiry() != restored.NextExpiry() {
		t.Fatal("Now or NextExpiry differ after restore")
	}
	for i, c := range cmds[2000:] {
		slot := uint64(2001 + i)
		if ro, rr := orig.Apply(slot, c), restored.Apply(slot, c); !reflect.DeepEqual(ro, rr) {
			t.Fatalf("command %d after restore: %+v, want %+v", slot, rr, ro)
		}
	}
}

// TestTableSnapshotLater checks that a captured snapshot encodes the
// table as it was at the capture, while commands are applied, results
// pruned from the dedupe memory and one replaced, on another goroutine
// (run with -race: the memory is shared, never changed in place).
func TestTableSnapshotLater(t *testing.T) {
	cmds := tblRandomCommands(11, 4000) // the second half prunes the first's IDs
	tb := NewTable(time.Second)
	for i, c := range cmds[:2000] {
		tb.Apply(uint64(i+1), c)
	}
	want, err := tb.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	snap, err := decodeTableSnapshot(want)
	if err != nil {
		t.Fatal(err)
	}
	encode, items := tb.snapshotLater()
	if n := len(snap.Locks) + len(snap.Delays) + len(snap.Seen); items != n || len(snap.Seen) == 0 {
		t.Fatalf("items = %d, want %d (seen %d)", items, n, len(snap.Seen))
	}
	done := make(chan []byte)
	go func() {
		b, err := encode()
		if err != nil {
			t.Error(err)
		}
		done <- b
	}()
	tb.rememberResult(snap.Seen[len(snap.Seen)-1].ID, Result{Code: CodeRejected, Err: "replaced"})
	for i, c := range cmds[2000:] {
		tb.Apply(uint64(2001+i), c)
	}
	if got := <-done; !bytes.Equal(got, want) {
		t.Fatalf("captured snapshot changed by later commands:\n%q\nwant\n%q", got, want)
	}
	if again, _ := encode(); !bytes.Equal(again, want) {
		t.Fatal("a second encode of the capture differs")
	}
	if now, _ := tb.Snapshot(); bytes.Equal(now, want) {
		t.Fatal("the table did not change: the test proves nothing")
	}
}

// TestTableSnapshotEmptyMemory checks that a table that never remembered a
// result snapshots as one whose memory was emptied or restored: equal
// tables give equal bytes.
func TestTableSnapshotEmptyMemory(t *testing.T) {
	fresh := NewTable(0)
	fresh.Apply(1, Command{Op: OpNoop, Time: 5})
	a, err := fresh.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	restored := NewTable(0)
	if err := restored.Restore(a); err != nil {
		t.Fatal(err)
	}
	if b, _ := restored.Snapshot(); !bytes.Equal(a, b) {
		t.Fatalf("fresh %q, restored %q", a, b)
	}
	if snap, err := decodeTableSnapshot(a); err != nil || len(snap.Seen) != 0 {
		t.Fatalf("snapshot %q: %v; want an empty list of remembered results", a, err)
	}
}

// TestTablePrunedBurstReleased checks that once a burst of remembered
// results is pruned the table no longer holds the chunks they were in.
func TestTablePrunedBurstReleased(t *testing.T) {
	tb := NewTable(0)
	for i := range 10_001 {
		tb.Apply(uint64(i+1), Command{Op: OpAcquire, ID: fmt.Sprintf("id-%d", i), Lock: "a", Owner: "o", Time: 1000, TTL: 10})
	}
	if len(tb.seen.raw.chunks) < 3 {
		t.Fatalf("%d chunks for 10,001 results: the test proves nothing", len(tb.seen.raw.chunks))
	}
	late := int64(1000) + DedupeWindow.Milliseconds() + 1
	if len(tb.seen.index)+len(tb.seen.clash) != 10_001 {
		t.Fatalf("%d IDs indexed, want 10,001", len(tb.seen.index)+len(tb.seen.clash))
	}
	tb.Apply(20_000, Command{Op: OpAcquire, ID: "late", Lock: "b", Owner: "o", Time: late, TTL: 10})
	if tb.seen.len() != 1 || len(tb.seen.raw.chunks) != 1 || tb.seen.raw.head != 0 || len(tb.seen.index)+len(tb.seen.clash) != 1 {
		t.Fatalf("remembered %d results in %d chunks (head %d), %d IDs indexed; want the late one only, in one", tb.seen.len(), len(tb.seen.raw.chunks), tb.seen.raw.head, len(tb.seen.index)+len(tb.seen.clash))
	}
	if r := tb.Apply(20_001, Command{Op: OpAcquire, ID: "late", Lock: "b", Owner: "o", Time: late, TTL: 10}); r.Index != 20_000 {
		t.Fatalf("the late result after the prune: %+v, want the one applied at 20000", r)
	}
}

func TestTableRestoreRefusesBadData(t *testing.T) {
	tests := []struct {
		name string
		data []byte
	}{
		{name: "empty", data: nil},
		{name: "not json", data: []byte("{garbage")},
		{name: "unknown format", data: []byte(`{"format":99}`)},
		{name: "unknown first byte", data: []byte{7, 0}},
		{name: "format 3 without its head", data: []byte{tableSnapBinary}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tb := NewTable(0)
			want := tb.Apply(1, tblAcquire("a", "o", 1000, 5000))
			if err := tb.Restore(tc.data); err == nil {
				t.Fatal("Restore accepted bad data")
			}
			if r := tb.Apply(2, tblGet("a", 1001)); r.Code != CodeOK || r.Lock != want.Lock {
				t.Fatalf("failed Restore changed the table: %+v", r)
			}
		})
	}
}

func TestTableOddInputsDoNotPanic(t *testing.T) {
	tb := NewTable(time.Duration(math.MaxInt64))
	cmds := []Command{
		{Op: OpAcquire, Time: math.MaxInt64 - 1, TTL: math.MaxInt64},
		{Op: OpAcquire, Lock: "n", Time: math.MinInt64, TTL: math.MinInt64},
		{Op: OpRenew, Lock: "", Owner: "", TTL: -5},
		{Op: OpTick, Time: math.MaxInt64},
		{Op: "", Lock: "\x00"},
		{Op: OpList},
	}
	for i, c := range cmds {
		tb.Apply(uint64(i), c)
	}
	if got := tb.Now(); got != math.MaxInt64 {
		t.Fatalf("Now = %d, want the largest Time applied", got)
	}
	tb.NextExpiry()
	if _, err := tb.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if err := tb.Restore([]byte(`{"format":1,"locks":[{"lockId":"a"},{"lockId":"a"}],"seen":[{"id":"x"},{"id":"x"}]}`)); err != nil {
		t.Fatal(err)
	}
	tb.Apply(1, Command{Op: OpAcquire, ID: "x", Lock: "a", Time: 1})
}
