// Package proc supervises child processes for drover: each runs in a process
// group of its own, dies with drover, and is stopped group and all.
package proc

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Supervise starts cmd in a process group of its own and waits for it to
// exit. If drover itself dies (even by SIGKILL), the kernel kills cmd
// (Pdeathsig), so no command outlives the worker that held its lock;
// processes that cmd forked are not covered, so scripts should exec their
// last command. Signals arriving on sigs are forwarded to the whole group.
// When stop is closed first, onStop (if set) is called, the group gets
// SIGTERM, then SIGKILL after grace, and stopped is true. Whatever the
// command started in its group is killed once it has exited, however it
// exited.
func Supervise(cmd *exec.Cmd, sigs <-chan os.Signal, stop <-chan struct{}, grace time.Duration, onStop func()) (waitErr error, stopped bool, startErr error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if cmd.WaitDelay == 0 {
		// A grandchild that left the group but holds the output pipes
		// must not keep Wait from returning.
		cmd.WaitDelay = max(grace, time.Second)
	}
	if err := cmd.Start(); err != nil {
		return nil, false, err
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			if s, ok := sig.(syscall.Signal); ok {
				_ = syscall.Kill(-pgid, s)
			}
		case <-stop:
			if onStop != nil {
				onStop()
			}
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			timer := time.NewTimer(grace)
			defer timer.Stop()
			select {
			case err := <-exited:
				waitErr = err
			case <-timer.C:
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				waitErr = <-exited
			}
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return waitErr, true, nil
		case err := <-exited:
			// Whatever it left running in its group would go on without
			// the lock.
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return err, false, nil
		}
	}
}

// Alive reports whether process pid runs: it exists and is not a zombie
// waiting for its parent to reap it (an orphan's new parent may never do so).
func Alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && err != syscall.EPERM {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "pid (comm) state ...": the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
