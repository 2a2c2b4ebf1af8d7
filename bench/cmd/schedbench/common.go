package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"
)

// fire is one task a scheduler submitted: its id, the tick it was for and
// when it was submitted.
type fire struct {
	id      string
	nominal time.Time
	at      time.Time
}

// kill is one SIGKILL of the run.
type kill struct {
	Name string    `json:"name"`
	At   time.Time `json:"at"`
}

type result struct {
	System        string         `json:"system"`
	DurationS     float64        `json:"duration_s"`
	EveryS        float64        `json:"every_s"`
	KillEveryS    float64        `json:"kill_every_s"`
	Kills         int            `json:"kills"`
	Start         time.Time      `json:"window_start"`
	Expected      int            `json:"expected_ticks"`
	Fired         int            `json:"fired"`
	Distinct      int            `json:"distinct_ticks"`
	Duplicates    int            `json:"duplicates"`
	Missed        int            `json:"missed"`
	LongestGapS   float64        `json:"longest_gap_s"`
	LateP50ms     float64        `json:"lateness_p50_ms"`
	LateP99ms     float64        `json:"lateness_p99_ms"`
	LateMaxms     float64        `json:"lateness_max_ms"`
	OutsideWindow int            `json:"outside_window"`
	Notes         map[string]any `json:"notes,omitempty"`
	KillLog       []kill         `json:"kill_log,omitempty"`
}

// summarize counts the fires whose tick falls in the window of expected
// ticks starting at start: a tick fired more than once counts its extra
// fires as duplicates, a tick not fired is missed. Lateness is each
// tick's first fire against its nominal time.
func summarize(system string, c config, start time.Time, fires []fire, kills []kill) result {
	expected := int(c.duration / c.every)
	r := result{System: system, DurationS: c.duration.Seconds(), EveryS: c.every.Seconds(), KillEveryS: c.killEvery.Seconds(),
		Kills: len(kills), Start: start, Expected: expected, KillLog: kills, Notes: map[string]any{}}
	first := make(map[int]fire)
	for _, f := range fires {
		d := f.nominal.Sub(start)
		slot := int(math.Floor(float64(d) / float64(c.every)))
		if d < 0 || slot >= expected {
			r.OutsideWindow++
			continue
		}
		r.Fired++
		if g, ok := first[slot]; !ok || f.at.Before(g.at) {
			first[slot] = f
		}
	}
	r.Distinct = len(first)
	r.Duplicates = r.Fired - r.Distinct
	r.Missed = expected - r.Distinct
	gap := 0
	for s := 0; s < expected; s++ {
		if _, ok := first[s]; ok {
			gap = 0
			continue
		}
		gap++
		r.LongestGapS = max(r.LongestGapS, float64(gap)*c.every.Seconds())
	}
	var late []float64
	for _, f := range first {
		late = append(late, float64(f.at.Sub(f.nominal))/float64(time.Millisecond))
	}
	slices.Sort(late)
	r.LateP50ms, r.LateP99ms = pct(late, 0.50), pct(late, 0.99)
	if len(late) > 0 {
		r.LateMaxms = math.Round(late[len(late)-1]*10) / 10
	}
	return r
}

func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return math.Round(sorted[max(i, 0)]*10) / 10
}

// child is a process this command started: a scheduler, a client or a
// server, killed with SIGKILL and started again with the same arguments.
type child struct {
	name   string
	bin    string
	args   []string
	log    string
	onLine func(string) // each line of its stdout, when set

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

var (
	childrenMu sync.Mutex
	children   []*child
)

func newChild(name, bin, logDir string, onLine func(string), args ...string) *child {
	c := &child{name: name, bin: bin, args: args, log: filepath.Join(logDir, name+".log"), onLine: onLine}
	childrenMu.Lock()
	children = append(children, c)
	childrenMu.Unlock()
	return c
}

// start starts the process; its stderr (and its stdout, without onLine)
// goes to its log file.
func (c *child) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := os.OpenFile(c.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "--- schedbench: start %s at %s\n", c.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin, c.args...)
	cmd.Stderr = f
	// The child dies with this process, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out io.ReadCloser
	if c.onLine != nil {
		if out, err = cmd.StdoutPipe(); err != nil {
			f.Close()
			return err
		}
	} else {
		cmd.Stdout = f
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	done := make(chan struct{})
	c.cmd, c.done = cmd, done
	go func() {
		if out != nil {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				c.onLine(sc.Text())
			}
		}
		err := cmd.Wait()
		fmt.Fprintf(f, "--- schedbench: %s exited at %s: %v\n", c.name, time.Now().Format(time.RFC3339Nano), err)
		f.Close()
		close(done)
	}()
	return nil
}

// kill sends SIGKILL and waits until the process is gone.
func (c *child) kill() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// alive reports whether the process runs.
func (c *child) alive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		return false
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// killAll kills every child still running.
func killAll() {
	childrenMu.Lock()
	defer childrenMu.Unlock()
	for _, c := range children {
		if c.alive() {
			c.kill()
		}
	}
}

// killLoop kills the victim every c.killEvery from start until the end of
// the window, keeps it down c.down and starts it again (restart may wait
// until it serves). It returns the kills it made.
func killLoop(ctx context.Context, c config, start time.Time, victim func() (*child, error), restart func(*child) error) ([]kill, error) {
	var kills []kill
	end := start.Add(c.duration)
	for at := start.Add(c.killEvery); at.Before(end); at = at.Add(c.killEvery) {
		if err := sleepUntil(ctx, at); err != nil {
			return kills, err
		}
		v, err := victim()
		if err != nil {
			return kills, fmt.Errorf("kill %d: %w", len(kills)+1, err)
		}
		v.kill()
		kills = append(kills, kill{Name: v.name, At: time.Now()})
		fmt.Fprintf(os.Stderr, "schedbench: killed %s at %s\n", v.name, time.Now().Format(time.TimeOnly))
		if err := sleepUntil(ctx, time.Now().Add(c.down)); err != nil {
			return kills, err
		}
		if err := restart(v); err != nil {
			return kills, fmt.Errorf("restart %s: %w", v.name, err)
		}
	}
	return kills, sleepUntil(ctx, end)
}

func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(t)):
		return nil
	}
}

// waitFor polls cond every 100 ms until it holds or d has passed.
func waitFor(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return nil
		}
		if err := sleepUntil(ctx, time.Now().Add(100*time.Millisecond)); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s: not within %s", what, d)
}

// executable is this command's binary, started again for the child roles.
func executable() (string, error) { return os.Executable() }

func sortFloats(s []float64) { slices.Sort(s) }
