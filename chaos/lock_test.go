package chaos

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// lockConfig sizes a lock history run.
type lockConfig struct {
	clients   int
	cycles    int // acquire, write, release cycles per client
	ttl       time.Duration
	names     []string
	longEvery int // every longEvery-th cycle of a client holds 100 ms
	// Faults, at fractions of the acquisitions expected, each at the next
	// long hold: SIGSTOP of the holder past its TTL, SIGKILL of the holder,
	// and the server's restart.
	pauseAt, killAt []float64
	serverAt        float64
	deadline        time.Duration
	minOps          int
}

// lockConfigFor returns the CI or the long configuration.
func lockConfigFor(long bool) lockConfig {
	c := lockConfig{clients: 8, cycles: 220, ttl: 2 * time.Second, names: []string{"a", "b", "c"}, longEvery: 25,
		pauseAt: []float64{0.15}, killAt: []float64{0.3}, serverAt: 0.5, deadline: 3 * time.Minute, minOps: 5000}
	if long {
		c.cycles, c.minOps, c.deadline = 1000, 20000, 15*time.Minute
		c.pauseAt, c.killAt, c.serverAt = []float64{0.1, 0.4, 0.7}, []float64{0.2, 0.6}, 0.5
	}
	return c
}

// lockClient is one lock client process (chaos/internal/lockclient).
type lockClient struct {
	*process
	id       int
	stderr   *bytes.Buffer
	killed   bool      // by the test
	reported bool      // its failure was reported
	last     string    // its last line (r.mu)
	lastAt   time.Time // when it came (r.mu)
}

// lockRun is one lock history run: the clients, the history their lines
// make, and the faults.
type lockRun struct {
	t       *testing.T
	cfg     lockConfig
	bin     string   // the lock client
	env     []string // the backend's part of the clients' environment
	restart func() outage

	mu         sync.Mutex
	clients    []*lockClient
	nextID     int
	ops        []porcupine.Operation
	dropped    map[lockOpKind]int // operations whose outcome is unknown
	acquired   int                // acquisitions that succeeded: the progress
	armed      faultKind          // the fault to inject at the next HOLD line
	faults     []fault
	held       map[time.Time]string // per pause, kill or restart, the lock name held
	losses     map[holding]loss     // losses the clients reported
	outages    []outage
	restarts   int            // clients started to replace killed ones
	restarting sync.WaitGroup // the server restart under way
}

// runLocks runs cfg's clients against the backend env describes, with
// restart to kill and restart the backend's server, and returns the
// history's verdicts.
func runLocks(t *testing.T, cfg lockConfig, env []string, restart func() outage) *lockReport {
	r := newLockRun(t, cfg, env, restart)
	began := time.Now()
	for range cfg.clients {
		r.startClient(cfg.cycles)
	}
	r.drive(began)
	took := time.Since(began)
	checkBegan := time.Now()
	verdicts := checkLockHistory(r.ops, 2*time.Minute)
	rep := &lockReport{cfg: cfg, took: took, checkTook: time.Since(checkBegan), verdicts: verdicts, ops: r.ops,
		dropped: r.dropped, faults: r.faults, outages: r.outages, takeovers: r.takeovers(), errors: r.clientErrors(),
		falseLosses: r.falseLosses()}
	return rep
}

// newLockRun prepares a run of cfg's clients against the backend env
// describes; restart kills and restarts the backend's server (nil when
// the run injects no fault of its own).
func newLockRun(t *testing.T, cfg lockConfig, env []string, restart func() outage) *lockRun {
	return &lockRun{t: t, cfg: cfg, bin: lockClientBin(t), env: env, restart: restart, dropped: map[lockOpKind]int{},
		held: map[time.Time]string{}, losses: map[holding]loss{}}
}

// startClient starts a lock client process with cycles cycles.
func (r *lockRun) startClient(cycles int) {
	r.mu.Lock()
	r.nextID++
	id := r.nextID
	r.mu.Unlock()
	c := &lockClient{id: id, stderr: &bytes.Buffer{}}
	env := append([]string{"CHAOS_CLIENT=" + strconv.Itoa(id), "CHAOS_CYCLES=" + strconv.Itoa(cycles),
		"CHAOS_TTL=" + r.cfg.ttl.String(), "CHAOS_NAMES=" + strings.Join(r.cfg.names, ","), "CHAOS_LONG_EVERY=" + strconv.Itoa(r.cfg.longEvery)}, r.env...)
	c.process = startProcess(r.t, fmt.Sprintf("lock client %d", id), &lineWriter{line: r.line}, &syncBuffer{b: c.stderr}, env, r.bin)
	r.mu.Lock()
	r.clients = append(r.clients, c)
	r.mu.Unlock()
}

// drive injects the faults as the history grows, and waits until every
// client has finished or the deadline passes.
func (r *lockRun) drive(began time.Time) {
	cfg := r.cfg
	expected := float64(cfg.clients * cfg.cycles)
	pauses, kills, serverDone := 0, 0, false
	for time.Since(began) < cfg.deadline {
		time.Sleep(50 * time.Millisecond)
		r.mu.Lock()
		progress, armed := float64(r.acquired)/expected, r.armed
		r.mu.Unlock()
		switch {
		case armed != "":
		case !serverDone && progress >= cfg.serverAt:
			r.arm(faultServerKill)
			serverDone = true
		case pauses < len(cfg.pauseAt) && progress >= cfg.pauseAt[pauses]:
			r.arm(faultClientPause)
			pauses++
		case kills < len(cfg.killAt) && progress >= cfg.killAt[kills]:
			r.arm(faultClientKill)
			kills++
		}
		if r.finished() {
			break
		}
	}
	r.restarting.Wait()
	if !r.finished() {
		r.dumpStuck()
		r.t.Fatalf("the lock clients did not finish within %s (%d operations)", cfg.deadline, len(r.ops))
	}
	if pauses < len(cfg.pauseAt) || kills < len(cfg.killAt) || !serverDone {
		r.t.Errorf("the clients finished before every planned fault (%d pauses, %d kills, server %t)", pauses, kills, serverDone)
	}
}

// dumpStuck logs, for a run that did not finish, each live client's last
// line and, from a SIGQUIT, its goroutines.
func (r *lockRun) dumpStuck() {
	r.mu.Lock()
	clients := slices.Clone(r.clients)
	r.mu.Unlock()
	for _, c := range clients {
		if c.exited() {
			continue
		}
		r.mu.Lock()
		r.t.Logf("client %d (pid %d) still runs; its last line, %s ago: %s", c.id, c.pid, time.Since(c.lastAt).Round(time.Millisecond), c.last)
		r.mu.Unlock()
		_ = c.signal(syscall.SIGQUIT)
	}
	for _, c := range clients {
		if c.wait(5 * time.Second) {
			b := c.stderr.String()
			r.t.Logf("client %d goroutines: %s", c.id, b[max(0, len(b)-6000):])
		}
	}
	for _, f := range r.faults {
		r.t.Logf("fault %s at %s until %s, pids %v", f.kind, f.at.Format("15:04:05.000"), f.until.Format("15:04:05.000"), f.pids)
	}
}

// arm makes the next HOLD line trigger fault k.
func (r *lockRun) arm(k faultKind) {
	r.mu.Lock()
	r.armed = k
	r.mu.Unlock()
}

// finished reports whether every client process has exited; a client that
// failed other than by a kill of the test's is an error.
func (r *lockRun) finished() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.clients {
		if !c.exited() {
			return false
		}
	}
	for _, c := range r.clients {
		if !c.killed && !c.reported && c.exitCode() != 0 {
			r.t.Errorf("lock client %d exited with %v: %s", c.id, c.err, c.stderr.String())
			c.reported = true
		}
	}
	return true
}

// line takes one line of a client's output into the history.
func (r *lockRun) line(s string) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return
	}
	id, _ := strconv.Atoi(f[1])
	r.mu.Lock()
	for _, c := range r.clients {
		if c.id == id {
			c.last, c.lastAt = s, time.Now()
		}
	}
	r.mu.Unlock()
	switch {
	case f[0] == "OP" && len(f) == 8:
		token, _ := strconv.ParseInt(f[4], 10, 64)
		call, _ := strconv.ParseInt(f[6], 10, 64)
		ret, _ := strconv.ParseInt(f[7], 10, 64)
		r.add(id, lockInput{Kind: lockOpKind(f[2]), Name: f[3], Client: id, Token: token}, f[5], call, ret)
	case f[0] == "LOST" && len(f) == 6:
		token, _ := strconv.ParseInt(f[3], 10, 64)
		at, _ := strconv.ParseInt(f[4], 10, 64)
		r.add(id, lockInput{Kind: opExpirable, Name: f[2], Client: id, Token: token}, resOK, at, at)
		r.mu.Lock()
		r.losses[holding{id, f[2], token}] = loss{kind: f[5], at: at}
		r.mu.Unlock()
	case f[0] == "HOLD" && len(f) == 4:
		r.hold(id, f[2])
	}
}

// add appends an operation to the history; one whose outcome is unknown
// is counted and left out.
func (r *lockRun) add(id int, in lockInput, result string, call, ret int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if result == "err" {
		r.dropped[in.Kind]++
		return
	}
	if in.Kind == opAcquire {
		r.acquired++
	}
	r.ops = append(r.ops, porcupine.Operation{ClientId: id, Input: in, Output: lockOutput{Result: result}, Call: call, Return: ret})
}

// holding names one holding of a lock: client, name, token.
type holding struct {
	client int
	name   string
	token  int64
}

// loss is a loss a client reported: what it came from ("key", "lease",
// "other") and from when the lock may be gone (Unix ns).
type loss struct {
	kind string
	at   int64
}

// falseLosses lists the holdings whose client saw the lock's key deleted
// before it released the lock, and then released it by token with success:
// the key was there all along (see TestEtcdLockNoFalseLossOnCluster). A
// loss seen during the release is the release's own deletion (a retry by
// token after an error).
func (r *lockRun) falseLosses() []string {
	var out []string
	for _, op := range r.ops {
		in := op.Input.(lockInput)
		l := r.losses[holding{in.Client, in.Name, in.Token}]
		if in.Kind == opRelease && op.Output.(lockOutput).Result == resOK && l.kind == "key" && l.at < op.Call {
			d := fmt.Sprintf("c%d %s token %d", in.Client, in.Name, in.Token)
			for _, f := range r.faults {
				if off := time.Duration(op.Call - f.at.UnixNano()); off > -3*time.Second && off < 3*time.Second {
					d += fmt.Sprintf(" (released %s after the %s)", off.Round(time.Millisecond), f.kind)
				}
			}
			out = append(out, d)
		}
	}
	return out
}

// clientErrors returns the distinct errors the clients wrote, at most 5.
func (r *lockRun) clientErrors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, c := range r.clients {
		for _, l := range strings.Split(strings.TrimSpace(c.stderr.String()), "\n") {
			if l != "" && !seen[l] && len(out) < 5 {
				seen[l] = true
				out = append(out, l)
			}
		}
	}
	return out
}

// hold injects the armed fault, if any, as client id has just begun a
// long hold of name: SIGSTOP of the client for TTL + 1.5 s, or SIGKILL and
// a replacement client (from that moment the model lets its locks expire),
// or the server's restart (which must keep the lock: nothing lets it
// expire).
func (r *lockRun) hold(id int, name string) {
	r.mu.Lock()
	k := r.armed
	var c *lockClient
	for _, x := range r.clients {
		if x.id == id {
			c = x
		}
	}
	if k == "" || c == nil {
		r.mu.Unlock()
		return
	}
	r.armed = ""
	if k == faultServerKill {
		r.mu.Unlock()
		r.restarting.Go(func() {
			o := r.restart()
			r.mu.Lock()
			r.outages = append(r.outages, o)
			r.faults = append(r.faults, fault{kind: faultServerKill, at: o.killed, until: o.ready})
			r.held[o.killed] = name
			r.mu.Unlock()
		})
		return
	}
	sig := syscall.SIGSTOP
	if k == faultClientKill {
		sig, c.killed = syscall.SIGKILL, true
	}
	if c.signal(sig) != nil {
		r.mu.Unlock()
		return
	}
	at := time.Now()
	for _, n := range r.cfg.names {
		r.ops = append(r.ops, porcupine.Operation{ClientId: id, Input: lockInput{Kind: opExpirable, Name: n, Client: id, Token: allTokens},
			Output: lockOutput{Result: resOK}, Call: at.UnixNano(), Return: at.UnixNano()})
	}
	r.held[at] = name
	ft := fault{kind: k, at: at, pids: []int{c.pid}}
	r.mu.Unlock()
	if k == faultClientKill {
		r.mu.Lock()
		r.faults = append(r.faults, ft)
		r.restarts++
		r.mu.Unlock()
		r.startClient(r.cfg.cycles / 2)
		return
	}
	time.AfterFunc(r.cfg.ttl+1500*time.Millisecond, func() {
		_ = c.signal(syscall.SIGCONT)
		ft.until = time.Now()
		r.mu.Lock()
		r.faults = append(r.faults, ft)
		r.mu.Unlock()
	})
}

// takeovers measures, for each pause and kill of a holder, the time from
// the fault to the next acquisition of its lock by another client.
func (r *lockRun) takeovers() map[faultKind][]time.Duration {
	out := map[faultKind][]time.Duration{}
	for _, ft := range r.faults {
		name, ok := r.held[ft.at]
		if !ok {
			continue
		}
		best := int64(0)
		for _, op := range r.ops {
			in := op.Input.(lockInput)
			if in.Kind == opAcquire && in.Name == name && op.Return > ft.at.UnixNano() && (best == 0 || op.Return < best) {
				best = op.Return
			}
		}
		if best > 0 {
			out[ft.kind] = append(out[ft.kind], time.Duration(best-ft.at.UnixNano()))
		}
	}
	return out
}

// lineWriter calls line for each complete line written to it.
type lineWriter struct {
	line func(string)
	buf  []byte
}

// Write implements io.Writer; exec calls it from one goroutine.
func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// visualize writes porcupine's view of a history to a file of the test's
// and returns its path.
func visualize(t *testing.T, v lockVerdict) string {
	t.Helper()
	m := lockModel
	m.Partition = nil
	dir := os.Getenv("DROVER_CHAOS_REPORT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s.html", strings.ReplaceAll(t.Name(), "/", "_"), v.name))
	if err := porcupine.VisualizePath(m, v.info, path); err != nil {
		t.Logf("visualize: %v", err)
	}
	return path
}
