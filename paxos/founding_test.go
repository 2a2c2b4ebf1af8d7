package paxos

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestProbeRefusesAWipedMember: a member whose data dir was wiped comes
// back with no promise and no accepted value; started as a founder it
// would vote as if it had promised nothing. The group has state, and the
// probe must say so, and what to do.
func TestProbeRefusesAWipedMember(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newTestCluster(t, 3, nil)
	defer c.close()
	c.startAll()
	c.leader(5 * time.Second)
	c.mustPropose(1, Command{Op: OpAcquire, Lock: "a", Owner: "o", TTL: 60000})
	c.stop(0)
	wiped := t.TempDir()
	if isNew, err := DataDirIsNew(wiped); err != nil || !isNew {
		t.Fatalf("DataDirIsNew(empty dir) = %v, %v", isNew, err)
	}
	if isNew, err := DataDirIsNew(c.dirs[1]); err != nil || isNew {
		t.Fatalf("DataDirIsNew(a member's dir) = %v, %v", isNew, err)
	}
	tr := c.net.Transport(0)
	start := time.Now()
	rep, err := ProbeGroup(context.Background(), ProbeConfig{ID: 0, Group: "test", Peers: c.peers, Transport: tr})
	if !errors.Is(err, ErrGroupHasState) || len(rep.HasState()) == 0 {
		t.Fatalf("probe of a group with state: %+v, %v", rep, err)
	}
	for _, want := range []string{"members remove --id 0", "--join", "members add --id 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the probe took %s: the members answer at once", d)
	}
}

// TestProbeFoundersStartingTogether: founders on new data dirs probe each
// other, all answer that they have nothing, and all go on at once.
func TestProbeFoundersStartingTogether(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	net := NewMemNetwork()
	defer net.Close()
	peers := []Peer{{ID: 0}, {ID: 1}, {ID: 2}}
	var wg sync.WaitGroup
	errs := make([]error, len(peers))
	reps := make([]ProbeReport, len(peers))
	start := time.Now()
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 100 * time.Millisecond) // not quite together
			reps[i], errs[i] = ProbeGroup(context.Background(), ProbeConfig{ID: p.ID, Group: "g", Peers: peers, Transport: net.Transport(p.ID)})
		}()
	}
	wg.Wait()
	for i := range peers {
		if errs[i] != nil || len(reps[i].Answered) < reps[i].Needed {
			t.Errorf("founder %d: %+v, %v", i, reps[i], errs[i])
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the founders' probes took %s, want well under DefaultProbeWait", d)
	}
	// A group of one has nobody to ask.
	if rep, err := ProbeGroup(context.Background(), ProbeConfig{ID: 5, Peers: []Peer{{ID: 5}}, Transport: net.Transport(5)}); err != nil || len(rep.Answered) != 0 {
		t.Fatalf("probe of a group of one: %+v, %v", rep, err)
	}
}

// TestProbeWithPeersDownGoesOn: with no peer answering, the probe cannot
// tell; it gives up after Wait and takes the group as new.
func TestProbeWithPeersDownGoesOn(t *testing.T) {
	net := NewMemNetwork()
	defer net.Close()
	rep, err := ProbeGroup(context.Background(), ProbeConfig{ID: 0, Peers: []Peer{{ID: 0}, {ID: 1}, {ID: 2}},
		Transport: net.Transport(0), Wait: 300 * time.Millisecond})
	if err != nil || len(rep.Answered) != 0 || rep.Needed != 2 {
		t.Fatalf("probe with every peer down: %+v, %v", rep, err)
	}
}

// TestProbeTakesNoStateOnlyFromAReply: messages the peers sent this node
// before its probe (queued for it while it was down) may show no state
// without meaning none: a PrePrepare of an older build carries no ballot.
// Only a peer's reply to the probe may say it has nothing; here peer 1's
// says it has a promise, and the probe refuses.
func TestProbeTakesNoStateOnlyFromAReply(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	net := NewMemNetwork()
	defer net.Close()
	peers := []Peer{{ID: 0}, {ID: 1}, {ID: 2}}
	tr := net.Transport(0)
	for _, from := range []NodeID{1, 2} {
		if err := net.Transport(from).Send(Message{Type: MsgPrePrepare, Group: "g", From: from, To: 0, Slot: 1, Seq: 1}); err != nil {
			t.Fatal(err)
		}
	}
	promise := Ballot{Round: 3, Node: 1}
	go func() {
		for m := range net.Transport(1).Recv() {
			if m.Type == MsgCatchUp {
				_ = net.Transport(1).Send(Message{Type: MsgCatchUpReply, Group: "g", From: 1, To: 0, Ballot: promise})
				return
			}
		}
	}()
	rep, err := ProbeGroup(context.Background(), ProbeConfig{ID: 0, Group: "g", Peers: peers, Transport: tr})
	if !errors.Is(err, ErrGroupHasState) {
		t.Fatalf("probe with a peer's promise behind queued PrePrepares: %+v, %v", rep, err)
	}
	if has := rep.HasState(); len(has) != 1 || has[0].ID != 1 || has[0].Ballot != promise {
		t.Fatalf("the probe found state at %+v, want node 1's promise %v", has, promise)
	}
}
