package paxos

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// recvAll collects what arrives at tr until nothing has come for quiet.
// recvAll receives what is in tr's inbox, then what comes before a quiet
// spell. A message already in the inbox is always taken: the quiet timer
// only runs while the inbox is empty, however slowly this goroutine runs.
func recvAll(tr Transport, quiet time.Duration) []Message {
	var out []Message
	for {
		select {
		case m, ok := <-tr.Recv():
			if !ok {
				return out
			}
			out = append(out, m)
			continue
		default:
		}
		select {
		case m, ok := <-tr.Recv():
			if !ok {
				return out
			}
			out = append(out, m)
		case <-time.After(quiet):
			return out
		}
	}
}

// recvN receives until it has n messages, or bound passes: for deliveries
// that a goroutine makes after a delay, which a quiet period cannot tell
// from a busy machine.
func recvN(tr Transport, n int, bound time.Duration) []Message {
	var out []Message
	deadline := time.After(bound)
	for len(out) < n {
		select {
		case m, ok := <-tr.Recv():
			if !ok {
				return out
			}
			out = append(out, m)
		case <-deadline:
			return out
		}
	}
	return out
}

func sendN(t *testing.T, from Transport, to NodeID, n int) {
	t.Helper()
	for i := range n {
		if err := from.Send(Message{Type: MsgHeartbeat, Group: "g", To: to, Seq: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMemNetworkDelivers(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	net := NewMemNetwork()
	defer net.Close()
	a, b := net.Transport(1), net.Transport(2)
	if net.Transport(1) != a {
		t.Fatal("Transport(1) twice gave two endpoints")
	}
	entries := []Entry{{Slot: 1, Ballot: Ballot{Round: 1, Node: 1}, Cmd: Command{Op: OpAcquire, Lock: "x"}}}
	if err := a.Send(Message{Type: MsgAccept, Group: "g", To: 2, Entries: entries}); err != nil {
		t.Fatal(err)
	}
	got := recvAll(b, 20*time.Millisecond)
	if len(got) != 1 || got[0].From != 1 || got[0].Entries[0].Cmd.Lock != "x" {
		t.Fatalf("got %+v", got)
	}
	got[0].Entries[0].Cmd.Lock = "changed"
	if entries[0].Cmd.Lock != "x" {
		t.Fatal("the receiver shares the sender's memory")
	}
	// A closed endpoint refuses to send; the id gets a fresh one.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if err := b.Send(Message{To: 1}); !errors.Is(err, errMemClosed) {
		t.Fatalf("Send on a closed endpoint = %v", err)
	}
	sendN(t, a, 2, 1) // lost: nobody listens
	b2 := net.Transport(2)
	if b2 == b {
		t.Fatal("a closed endpoint was handed out again")
	}
	sendN(t, a, 2, 1)
	if got := recvAll(b2, 20*time.Millisecond); len(got) != 1 {
		t.Fatalf("new endpoint got %d messages, want 1", len(got))
	}
}

func TestMemNetworkFaults(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cases := []struct {
		name     string
		opts     []MemOption
		min, max int // messages received of 2,000 sent
	}{
		{name: "no faults", min: 2000, max: 2000},
		{name: "drop 30%", opts: []MemOption{MemDropRate(0.3)}, min: 1250, max: 1550},
		{name: "duplicate 20%", opts: []MemOption{MemDuplicateRate(0.2)}, min: 2300, max: 2500},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			net := NewMemNetwork(append(tc.opts, MemSeed(1), MemInboxSize(10000))...)
			defer net.Close()
			a, b := net.Transport(1), net.Transport(2)
			sendN(t, a, 2, 2000)
			got := len(recvAll(b, 20*time.Millisecond))
			if got < tc.min || got > tc.max {
				t.Fatalf("received %d, want %d..%d (stats %+v)", got, tc.min, tc.max, net.Stats())
			}
			st := net.Stats()
			if st.Sent != 2000 || st.Delivered != uint64(got) {
				t.Fatalf("stats %+v, received %d", st, got)
			}
		})
	}
}

func TestMemNetworkSeedReplays(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	run := func() []uint64 {
		net := NewMemNetwork(MemSeed(99), MemDropRate(0.5), MemDuplicateRate(0.3), MemInboxSize(1000))
		defer net.Close()
		a, b := net.Transport(1), net.Transport(2)
		sendN(t, a, 2, 200)
		var seqs []uint64
		for _, m := range recvAll(b, 20*time.Millisecond) {
			seqs = append(seqs, m.Seq)
		}
		return seqs
	}
	x, y := run(), run()
	if len(x) == 0 || len(x) != len(y) {
		t.Fatalf("same seed, different deliveries: %d vs %d", len(x), len(y))
	}
	for i := range x {
		if x[i] != y[i] {
			t.Fatalf("same seed, delivery %d differs: %d vs %d", i, x[i], y[i])
		}
	}
}

func TestMemNetworkDelayReorders(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	net := NewMemNetwork(MemSeed(3), MemDelay(0, 5*time.Millisecond))
	defer net.Close()
	a, b := net.Transport(1), net.Transport(2)
	start := time.Now()
	sendN(t, a, 2, 200)
	got := recvN(b, 200, time.Minute)
	if len(got) != 200 {
		t.Fatalf("received %d of 200 delayed messages", len(got))
	}
	inversions := 0
	for i := 1; i < len(got); i++ {
		if got[i].Seq < got[i-1].Seq {
			inversions++
		}
	}
	if inversions == 0 {
		t.Fatal("random delays did not reorder anything")
	}
	if time.Since(start) < 3*time.Millisecond {
		t.Fatal("messages were not delayed")
	}
	// Close drops what is still delayed and ends the delivery goroutine.
	net.SetDelay(time.Hour, time.Hour)
	sendN(t, a, 2, 5)
	if err := net.Close(); err != nil {
		t.Fatal(err)
	}
	if err := net.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if err := a.Send(Message{To: 2}); !errors.Is(err, errMemClosed) {
		t.Fatalf("Send after Close = %v", err)
	}
}

func TestMemNetworkPartitionIsolateHeal(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	net := NewMemNetwork()
	defer net.Close()
	tr := map[NodeID]Transport{1: net.Transport(1), 2: net.Transport(2), 3: net.Transport(3)}
	reach := func(from, to NodeID) bool {
		sendN(t, tr[from], to, 1)
		return len(recvAll(tr[to], 10*time.Millisecond)) == 1
	}
	cases := []struct {
		name   string
		set    func()
		from   NodeID
		to     NodeID
		reachs bool
	}{
		{name: "partitioned across", set: func() { net.Partition(1) }, from: 1, to: 2},
		{name: "partitioned back", from: 2, to: 1},
		{name: "same side", from: 2, to: 3, reachs: true},
		{name: "healed", set: net.Heal, from: 1, to: 2, reachs: true},
		{name: "isolated sends nothing", set: func() { net.Isolate(3) }, from: 3, to: 1},
		{name: "isolated gets nothing", from: 2, to: 3},
		{name: "others unaffected", from: 1, to: 2, reachs: true},
		{name: "healed again", set: net.Heal, from: 2, to: 3, reachs: true},
	}
	for _, tc := range cases {
		if tc.set != nil {
			tc.set()
		}
		if got := reach(tc.from, tc.to); got != tc.reachs {
			t.Fatalf("%s: %d reaches %d = %v, want %v", tc.name, tc.from, tc.to, got, tc.reachs)
		}
	}
}

func TestMemNetworkFullInboxDrops(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	net := NewMemNetwork(MemInboxSize(3))
	defer net.Close()
	a, b := net.Transport(1), net.Transport(2)
	done := make(chan struct{})
	go func() { // Send never blocks, even on a full inbox.
		defer close(done)
		sendN(t, a, 2, 10)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Send blocked on a full inbox")
	}
	if got := len(recvAll(b, 10*time.Millisecond)); got != 3 {
		t.Fatalf("received %d, want the inbox size 3", got)
	}
	if st := net.Stats(); st.Overflow != 7 {
		t.Fatalf("stats %+v, want 7 overflowed", st)
	}
}
