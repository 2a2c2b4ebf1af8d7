package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/queue"
)

// sseEvent is one event of a task's stream as a follower got it.
type sseEvent struct {
	Seq     int64           `json:"seq"`
	Attempt int             `json:"attempt"`
	Type    string          `json:"type"`
	Data    json.RawMessage `json:"data"`
}

// sseFollower follows a task's stream over SSE from the servers it is
// given, reconnecting with Last-Event-ID to the next one when a
// connection ends before the stream's end.
type sseFollower struct {
	mu         sync.Mutex
	events     []sseEvent
	arrived    []time.Time // when each event came
	reconnects int
	resumes    int // connections answered 200 that resumed with Last-Event-ID
	ended      bool
	reason     string   // the end event's reason
	served     []string // the server of each connection answered 200, in order
}

// follow reads task id's stream until its end event, or ctx ends. addrs
// returns the servers to try, in order. Until the first event it tries
// the first server again rather than the next, so that a server slow to
// answer at the start does not leave the follower on another than the
// one the test means to cut.
func (f *sseFollower) follow(ctx context.Context, id string, addrs func() []string) {
	for i := 0; ctx.Err() == nil; i++ {
		for _, addr := range addrs() {
			if f.once(ctx, addr, id) {
				return
			}
			if f.count() == 0 {
				break
			}
		}
		f.mu.Lock()
		f.reconnects++
		f.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
}

// once reads the stream from addr from the event after the last one got;
// it reports whether the stream ended.
func (f *sseFollower) once(ctx context.Context, addr, id string) bool {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/v1/tasks/"+id+"/stream", nil)
	if err != nil {
		return false
	}
	req.Header.Set("Accept", "text/event-stream")
	f.mu.Lock()
	resume := len(f.events) > 0
	if resume {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(f.events[len(f.events)-1].Seq, 10))
	}
	f.mu.Unlock()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	f.mu.Lock()
	f.served = append(f.served, addr)
	f.mu.Unlock()
	if resume {
		f.mu.Lock()
		f.resumes++
		f.mu.Unlock()
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var kind string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			kind = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data := strings.TrimPrefix(line, "data: ")
			if kind == "end" {
				var end struct {
					Reason string `json:"reason"`
				}
				_ = json.Unmarshal([]byte(data), &end)
				if end.Reason == "done" || end.Reason == "ended" {
					f.mu.Lock()
					f.ended, f.reason = true, end.Reason
					f.mu.Unlock()
					return true
				}
				return false // closing, error: reconnect
			}
			var ev sseEvent
			if json.Unmarshal([]byte(data), &ev) == nil {
				f.mu.Lock()
				f.events = append(f.events, ev)
				f.arrived = append(f.arrived, time.Now())
				f.mu.Unlock()
			}
		case line == "":
			kind = ""
		}
	}
	return false
}

func (f *sseFollower) count() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.events) }

// checkStream checks what the follower got: seq 1, 2, 3, ... with no gap
// and no duplicate; no event of an attempt after the first event of a
// later one; within an attempt the emitter's events in order; the stream
// ends with done; every event the emitter saw stored (its log's A lines)
// is there. It returns the attempts seen.
func checkStream(t *testing.T, f *sseFollower, logPath, id string) []int {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ended {
		t.Errorf("the follower got no end (%d events)", len(f.events))
	}
	got := map[[2]int]bool{} // attempt, i
	maxAttempt, lastI := 0, map[int]int{}
	var attempts []int
	for k, ev := range f.events {
		if ev.Seq != int64(k+1) {
			t.Fatalf("event %d has seq %d: a gap or a duplicate (%+v)", k+1, ev.Seq, ev)
		}
		if ev.Attempt < maxAttempt {
			t.Errorf("event %d of attempt %d after attempt %d's boundary", ev.Seq, ev.Attempt, maxAttempt)
		}
		if ev.Attempt > maxAttempt {
			maxAttempt = ev.Attempt
			attempts = append(attempts, ev.Attempt)
			lastI[ev.Attempt] = -1
		}
		if ev.Type == "progress" {
			var d struct {
				I int `json:"i"`
			}
			_ = json.Unmarshal(ev.Data, &d)
			if d.I <= lastI[ev.Attempt] {
				t.Errorf("event %d: i=%d after i=%d in attempt %d", ev.Seq, d.I, lastI[ev.Attempt], ev.Attempt)
			}
			lastI[ev.Attempt] = d.I
			got[[2]int{ev.Attempt, d.I}] = true
		}
	}
	boundary := map[int]int64{} // attempt -> seq of its attempt_started
	for _, ev := range f.events {
		if ev.Type == "attempt_started" {
			if _, ok := boundary[ev.Attempt]; !ok {
				boundary[ev.Attempt] = ev.Seq
			}
		}
	}
	for _, ev := range f.events {
		for a, seq := range boundary {
			if ev.Attempt < a && ev.Seq > seq {
				t.Errorf("event %d (%s) of attempt %d after attempt %d's attempt_started (event %d): a stale write", ev.Seq, ev.Type, ev.Attempt, a, seq)
			}
		}
	}
	if n := len(f.events); n == 0 || f.events[n-1].Type != "done" {
		t.Errorf("the follower's stream does not end with done: its end's reason is %q", f.reason)
	}
	b, _ := os.ReadFile(logPath)
	acked := 0
	for _, line := range strings.Split(string(b), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 6 || fs[0] != "A" || fs[1] != id {
			continue
		}
		a, _ := strconv.Atoi(fs[2])
		i, _ := strconv.Atoi(fs[3])
		acked++
		if !got[[2]int{a, i}] {
			t.Errorf("event i=%d of attempt %d was stored (its flush returned) but the follower never got it", i, a)
		}
	}
	t.Logf("the follower got %d events (attempts %v) over %d resumed connections (%d rounds of failed ones); %d events acknowledged to the emitter",
		len(f.events), attempts, f.resumes, f.reconnects, acked)
	return attempts
}

// streamRun starts an emitter on set and follows task s-1's stream while
// fault runs once the follower got 40 events. fault is given the emitter
// and a way to start another; it returns the emitter to watch after it.
func streamRun(t *testing.T, set *etcdSet, addrs func() []string, fault func(em *process, start func() *process, release func()) *process) (*sseFollower, string) {
	t.Helper()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "runs.log")
	// The emitter waits a third of the way while gate exists, until the
	// fault has struck (release): the stream is still being written when
	// it does, whatever the machine's load.
	gate := filepath.Join(dir, "gate")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	release := func() { _ = os.Remove(gate) }
	defer release()
	cli := etcdClient(t, set.endpoints())
	qc, err := queue.NewClient(cli, "drover")
	if err != nil {
		t.Fatal(err)
	}
	errf, err := os.Create(filepath.Join(dir, "emitter.err"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = errf.Close() })
	startEmitter := func() *process {
		return startProcess(t, "emitter", nil, errf, nil, wfBin(t), "-role", "emitter", "-endpoints", strings.Join(set.endpoints(), ","),
			"-log", logPath, "-events", strconv.Itoa(emitterEvents), "-emit-every", "10ms", "-ttl", "3s", "-gate", gate)
	}
	em, emitters := startEmitter(), 1
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := qc.Submit(ctx, "streams", []queue.Task{{ID: "s-1", Type: "emit", MaxRetries: new(20)}}, nil); err != nil {
		t.Fatal(err)
	}
	f := &sseFollower{}
	done := make(chan struct{})
	go func() { defer close(done); f.follow(ctx, "s-1", addrs) }()
	waitFor(t, "the follower to get 40 events", 30*time.Second, func() bool { return f.count() >= 40 })
	// The fault strikes while the emitter waits at the gate, with no flush
	// in flight: a write stored just before a pause but logged after it
	// would look like a late write.
	waitFor(t, "the emitter to reach the gate", 30*time.Second, func() bool { return loggedEvent(logPath, emitterEvents/3-1) })
	if next := fault(em, startEmitter, release); next != em {
		em, emitters = next, emitters+1
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-tick.C:
			// An emitter that lost its lease in the outage exits (70):
			// another takes the task over, as a fleet's next worker would.
			if em.exited() {
				em, emitters = startEmitter(), emitters+1
			}
			continue
		case <-ctx.Done():
		}
		<-done
		st := "unknown"
		if tk, err := qc.Get(context.Background(), "s-1"); err == nil {
			st = string(tk.CurrentStatus)
		}
		f.mu.Lock()
		n, rc := len(f.events), f.reconnects
		f.mu.Unlock()
		t.Fatalf("the stream did not end within 90 s: the follower got %d events over %d reconnects; %d are stored; the task is %s",
			n, rc, len(storedEvents(t, addrs(), "s-1")), st)
	}
	t.Logf("%d emitter processes ran the task", emitters)
	if t.Failed() {
		logTail(t, filepath.Join(dir, "emitter.err"))
		logTail(t, logPath)
	}
	if testing.Verbose() {
		logGaps(t, f, logPath)
	}
	em.kill()
	stored := storedEvents(t, addrs(), "s-1")
	if len(stored) > 0 && stored[len(stored)-1].Type == "done" && f.count() < len(stored) {
		t.Errorf("the follower ended (reason %q) after %d events, but the stream stores %d ending with done: it ended before the done", f.reason, f.count(), len(stored))
	}
	return f, logPath
}

// emitterEvents is how many events streamRun's emitter emits.
const emitterEvents = 150

// loggedEvent reports whether the emitters' log at path says event i was
// stored (a line "A task attempt i pid unix-ns").
func loggedEvent(path string, i int) bool {
	b, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(b), "\n") {
		if fs := strings.Fields(line); len(fs) == 6 && fs[0] == "A" && fs[3] == strconv.Itoa(i) {
			return true
		}
	}
	return false
}

// storedEvents reads task id's stored events as JSON (not SSE) from the
// first server of addrs that answers them all, each request bounded to
// 5 s.
func storedEvents(t *testing.T, addrs []string, id string) []sseEvent {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	for _, addr := range addrs {
		if all, ok := storedFrom(client, addr, id); ok {
			return all
		}
	}
	return nil
}

// storedFrom pages through task id's stored events on addr until a page
// is empty or its next does not advance; false on any error.
func storedFrom(client *http.Client, addr, id string) ([]sseEvent, bool) {
	var all []sseEvent
	for from := int64(1); ; {
		resp, err := client.Get(fmt.Sprintf("http://%s/v1/tasks/%s/stream?from=%d", addr, id, from))
		if err != nil {
			return nil, false
		}
		var page struct {
			Events []sseEvent `json:"events"`
			Next   int64      `json:"next"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return nil, false
		}
		all = append(all, page.Events...)
		if len(page.Events) == 0 || page.Next <= from {
			return all, true
		}
		from = page.Next
	}
}

// logTail logs the last 2 KiB of file path.
func logTail(t *testing.T, path string) {
	t.Helper()
	b, _ := os.ReadFile(path)
	t.Logf("tail of %s:\n%s", filepath.Base(path), b[max(0, len(b)-2048):])
}

// TestStreamSurvivesServerRestart follows a task's stream over SSE from
// drover server while the server is SIGKILLed and restarted on its data
// dir mid-stream (down 1 s); an emitter process writes 150 events, one
// every 10 ms. The follower reconnects with Last-Event-ID and gets every
// event once, in order, no gap, and every event whose flush returned to
// the emitter.
func TestStreamSurvivesServerRestart(t *testing.T) {
	set := startEtcdSetHTTP(t, droverBin(t), 1, true)
	m := set.members[0]
	f, logPath := streamRun(t, set, func() []string { return []string{m.httpAddr} }, func(em *process, _ func() *process, release func()) *process {
		o := set.killAndRestart(m, time.Second, release)
		t.Logf("server killed at %s, serving again %s later", f0(o), o.ready.Sub(o.killed).Round(time.Millisecond))
		return em
	})
	checkStream(t, f, logPath, "s-1")
	if f.resumes == 0 {
		t.Errorf("the follower never resumed with Last-Event-ID: the restart did not cut its stream")
	}
}

func f0(o outage) string { return o.killed.Format("15:04:05.000") }

// TestStreamSurvivesLeaderFailover follows a task's stream over SSE on a
// three-member cluster while the etcd leader is SIGKILLed mid-stream (and
// restarted on its data dir TTL + 0.5 s later). The follower reads from the
// members in turn, reconnecting with Last-Event-ID; it gets every event
// once, in order, with no event of an attempt after a later attempt's
// boundary, and every event whose flush returned to the emitter.
func TestStreamSurvivesLeaderFailover(t *testing.T) {
	bin := droverBin(t)
	if f := missingClusterFlag(t, bin); f != "" {
		t.Skipf("drover server has no %s", f)
	}
	set := startEtcdSetHTTP(t, bin, 3, true)
	var mu sync.Mutex
	var down *member
	var killedAt string
	first, err := set.leader()
	if err != nil {
		t.Fatal(err)
	}
	// The leader first: the follower connects to it, and its kill cuts
	// the follower's stream.
	addrs := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		if first != down {
			out = append(out, first.httpAddr)
		}
		for _, m := range set.members {
			if m != down && m != first {
				out = append(out, m.httpAddr)
			}
		}
		return out
	}
	f, logPath := streamRun(t, set, addrs, func(em *process, _ func() *process, release func()) *process {
		l, err := set.leader()
		if err != nil {
			t.Fatal(err)
		}
		if l != first {
			t.Logf("the leader changed before the kill (%s, then %s): killing the member the follower reads from", first.name, l.name)
			l = first
		}
		mu.Lock()
		down = l
		mu.Unlock()
		o := set.killAndRestart(l, 3500*time.Millisecond, release)
		mu.Lock()
		down = nil
		mu.Unlock()
		killedAt = f0(o)
		t.Logf("leader %s killed at %s: new leader %s later, back %s later", o.member, f0(o), o.elected.Sub(o.killed).Round(time.Millisecond), o.ready.Sub(o.killed).Round(time.Millisecond))
		return em
	})
	attempts := checkStream(t, f, logPath, "s-1")
	t.Logf("attempts in the stream: %s", fmt.Sprint(attempts))
	if f.resumes == 0 {
		t.Errorf("the follower never resumed with Last-Event-ID: the kill of the member it read from did not cut its stream (it read from %v; %s was killed at %s)", f.served, first.httpAddr, killedAt)
	}
}

// logGaps logs the pauses over 500 ms in what the follower got and in what
// the emitter stored.
func logGaps(t *testing.T, f *sseFollower, logPath string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := 1; k < len(f.arrived); k++ {
		if d := f.arrived[k].Sub(f.arrived[k-1]); d > 500*time.Millisecond {
			t.Logf("the follower got nothing for %s before event %d (%s)", d.Round(time.Millisecond), f.events[k].Seq, f.events[k].Type)
		}
	}
	b, _ := os.ReadFile(logPath)
	var prev int64
	for _, line := range strings.Split(string(b), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 6 {
			continue
		}
		ns, _ := strconv.ParseInt(fs[5], 10, 64)
		if prev != 0 && time.Duration(ns-prev) > 500*time.Millisecond {
			t.Logf("the emitter stored nothing for %s before event %s of attempt %s", time.Duration(ns-prev).Round(time.Millisecond), fs[3], fs[2])
		}
		prev = ns
	}
}

// TestStreamFencesPausedEmitter follows a task's stream over SSE while its
// emitter process is SIGSTOPped mid-stream past its TTL (3 s): another
// emitter takes the task over as attempt 2, then the first is continued,
// and its late writes must be fenced. The follower gets at least two
// attempts, no event of the old attempt after the new one's
// attempt_started, every event once and in order, and every event whose
// flush returned; the paused emitter stored nothing after its pause.
func TestStreamFencesPausedEmitter(t *testing.T) {
	set := startEtcdSetHTTP(t, droverBin(t), 1, true)
	m := set.members[0]
	var paused *process
	var pausedAt time.Time
	f, logPath := streamRun(t, set, func() []string { return []string{m.httpAddr} }, func(em *process, start func() *process, release func()) *process {
		if err := em.signal(syscall.SIGSTOP); err != nil || !em.waitStopped() {
			t.Fatalf("the emitter was not stopped: %v", err)
		}
		release()
		paused, pausedAt = em, time.Now()
		next := start()
		time.Sleep(3*time.Second + 1500*time.Millisecond)
		_ = em.signal(syscall.SIGCONT)
		t.Logf("emitter %d paused %s (TTL 3 s), then continued; emitter %d took over", em.pid, 3*time.Second+1500*time.Millisecond, next.pid)
		return next
	})
	attempts := checkStream(t, f, logPath, "s-1")
	if len(attempts) < 2 {
		t.Errorf("attempts in the stream %v: want at least 2, the pause did not cause a takeover", attempts)
	}
	if !paused.wait(10 * time.Second) {
		t.Errorf("the paused emitter %d did not end within 10 s of its SIGCONT", paused.pid)
	} else if code := paused.exitCode(); code != 70 {
		t.Errorf("the paused emitter %d exited %d, want 70 (its lease lost)", paused.pid, code)
	}
	b, _ := os.ReadFile(logPath)
	for _, line := range strings.Split(string(b), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 6 || fs[0] != "A" || fs[4] != strconv.Itoa(paused.pid) {
			continue
		}
		if ns, _ := strconv.ParseInt(fs[5], 10, 64); ns > pausedAt.UnixNano() {
			t.Errorf("the paused emitter stored event i=%s of attempt %s after its pause: a late write not fenced", fs[3], fs[2])
		}
	}
}
