package chaos

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// process is a subprocess of a test: started with Pdeathsig so it never
// outlives the test binary, killed when the test ends, and reaped by a
// goroutine of its own so that exited reports its end without blocking.
type process struct {
	name    string
	cmd     *exec.Cmd
	pid     int
	started time.Time
	done    chan struct{} // closed once the process was reaped
	err     error         // Wait's error, once done is closed
	ended   time.Time     // when it was reaped, once done is closed
}

// startProcess starts bin with args and env added to the test's
// environment; stdout and stderr go to the writers given (nil: discarded).
func startProcess(t *testing.T, name string, stdout, stderr io.Writer, env []string, bin string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, pid: cmd.Process.Pid, started: time.Now(), done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		p.ended = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() { p.kill() })
	return p
}

// signal sends sig to the process unless it has been reaped.
func (p *process) signal(sig syscall.Signal) error {
	if p.exited() {
		return errors.New(p.name + " has exited")
	}
	return p.cmd.Process.Signal(sig)
}

// kill sends SIGKILL (which also ends a stopped process) and waits until
// the process is reaped.
func (p *process) kill() {
	_ = p.signal(syscall.SIGKILL)
	<-p.done
}

// exited reports whether the process has ended and been reaped.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitCode is the process's exit status once it has exited: -1 when a
// signal ended it.
func (p *process) exitCode() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// endedBy waits until the process was reaped and reports whether signal
// sig ended it.
func (p *process) endedBy(sig syscall.Signal) bool {
	<-p.done
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// wait waits up to d for the process to end by itself and reports whether
// it did.
func (p *process) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// waitStopped waits, at most 5 s, until the kernel shows the process
// stopped (state T in /proc/PID/stat) after a SIGSTOP: the signal's
// return does not mean the process has stopped, and it may log and write
// for a few milliseconds more. It reports whether the stop was seen.
func (p *process) waitStopped() bool {
	for range 5000 {
		if stoppedState(p.pid) {
			return true
		}
		if p.exited() {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// stoppedState reports whether /proc/PID/stat shows pid stopped.
func stoppedState(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses, so the
	// state is the field after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't')
}
