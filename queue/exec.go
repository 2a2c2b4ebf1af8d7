package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/droverhq/drover/internal/proc"
)

// ExitPermanent is the exit code (EX_DATAERR) with which an exec handler's
// command says its failure is permanent.
const ExitPermanent = 65

// DefaultMaxOutput bounds an exec handler's result.
const DefaultMaxOutput = MaxResult

// ExecHandler returns a handler that runs argv in a process of its own for
// each task, so that tasks are isolated from each other and from the
// worker: the task as JSON on standard
// input, its standard output (at most maxOutput bytes; 0 means
// DefaultMaxOutput) as the result. Exit 0 is success; exit 65 (EX_DATAERR) a
// permanent failure; any other exit, a signal, or a timeout a transient one.
// More output than maxOutput is a permanent failure, and the excess is
// discarded as it arrives, so no amount of output can exhaust memory. When
// the task's context ends (timeout, cancellation, lost claim), the process
// group gets SIGTERM, then SIGKILL after grace. The command gets
// DROVER_TASK_ID, DROVER_TASK_TYPE, DROVER_ATTEMPT and DROVER_CLAIM_TOKEN in
// its environment; its standard error goes to stderr, and the last 2 KiB of
// it to the task's error.
func ExecHandler(argv []string, maxOutput int, grace time.Duration, stderr *os.File) Handler {
	if maxOutput <= 0 {
		maxOutput = DefaultMaxOutput
	}
	if grace <= 0 {
		grace = 5 * time.Second
	}
	return func(ctx context.Context, t *Task) ([]byte, error) {
		in, err := json.Marshal(t)
		if err != nil {
			return nil, Permanent(fmt.Errorf("encode task: %w", err))
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "DROVER_TASK_ID="+t.ID, "DROVER_TASK_TYPE="+t.Type,
			"DROVER_ATTEMPT="+strconv.Itoa(t.Attempt), "DROVER_CLAIM_TOKEN="+strconv.FormatInt(t.Token, 10))
		cmd.Stdin = bytes.NewReader(in)
		out := &boundedBuffer{limit: maxOutput}
		tail := &tailBuffer{limit: 2048}
		cmd.Stdout = out
		if stderr != nil {
			cmd.Stderr = multiWriter{stderr, tail}
		} else {
			cmd.Stderr = tail
		}
		waitErr, stopped, startErr := proc.Supervise(cmd, nil, ctx.Done(), grace, nil)
		switch {
		case startErr != nil:
			return nil, Permanent(fmt.Errorf("start %s: %w", argv[0], startErr))
		case stopped:
			return nil, fmt.Errorf("%s stopped: %w", argv[0], context.Cause(ctx))
		case out.over:
			return nil, Permanent(fmt.Errorf("%s printed %d bytes, over the %d-byte result limit", argv[0], out.total, maxOutput))
		case waitErr == nil:
			return out.Bytes(), nil
		}
		var ee *exec.ExitError
		msg := waitErr.Error()
		if s := bytes.TrimSpace(tail.Bytes()); len(s) > 0 {
			msg += ": " + string(s)
		}
		if errors.As(waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && !ws.Signaled() && ws.ExitStatus() == ExitPermanent {
				return nil, Permanent(fmt.Errorf("%s: %s", argv[0], msg))
			}
		}
		return nil, fmt.Errorf("%s: %s", argv[0], msg)
	}
}

// boundedBuffer keeps the first limit bytes written and counts the rest. It
// has no ReadFrom on purpose: io.Copy would use bytes.Buffer's, which reads
// everything into memory.
type boundedBuffer struct {
	buf   []byte
	limit int
	total int
	over  bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.total += len(p)
	if room := b.limit - len(b.buf); room < len(p) {
		b.over = true
		if room > 0 {
			b.buf = append(b.buf, p[:room]...)
		}
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Bytes returns what was kept.
func (b *boundedBuffer) Bytes() []byte { return b.buf }

// tailBuffer keeps the last limit bytes written.
type tailBuffer struct {
	buf   []byte
	limit int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.limit {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.limit:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) Bytes() []byte { return b.buf }

type multiWriter struct {
	a *os.File
	b *tailBuffer
}

func (m multiWriter) Write(p []byte) (int, error) {
	_, _ = m.a.Write(p)
	return m.b.Write(p)
}
