package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// startEventer starts cmd, a worker process of a demo, and a reader that
// sends each line of its stdout that decodes as an E to events, until the
// output ends or ctx does. The process gets no ETCD_ENDPOINTS of the
// caller's (its flags name the demo's private etcd), its stderr is this
// process's, and it dies with the demo however the demo ends. readers
// counts the reader; eof, when not nil, is closed as the reader ends.
func startEventer[E any](ctx context.Context, cmd *exec.Cmd, id string, events chan<- E, readers *sync.WaitGroup, eof chan struct{}) error {
	cmd.Env = append(os.Environ(), "ETCD_ENDPOINTS=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("demo: start %s: %w", id, err)
	}
	readers.Add(1)
	go func() {
		defer readers.Done()
		if eof != nil {
			defer close(eof)
		}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev E
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return nil
}
