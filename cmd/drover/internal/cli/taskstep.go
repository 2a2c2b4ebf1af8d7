package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/proc"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
)

// The steps of drover task run: shell commands, each given the state the
// step before printed and the files it may end with (a sleep, a wait for
// a signal, children to spawn), and the signal or the children's outcomes
// the step before waited for.

// stepRunner runs the steps of drover task run as shell commands.
type stepRunner struct {
	a      *app
	id     string
	grace  time.Duration
	sigs   chan os.Signal // signals for the running step's process group
	inStep atomic.Bool
	token  int64 // the fencing token the task is held with
	lost   bool  // a step was stopped because the lock was lost
}

// stepFiles are the files a step may write to end with a sleep, a wait
// or a spawn (empty files, removed by done).
type stepFiles struct {
	sleep, wait, spawn string
}

// newStepFiles makes the empty files of one step.
func newStepFiles() (stepFiles, func(), error) {
	var fs stepFiles
	var made []string
	done := func() {
		for _, n := range made {
			os.Remove(n)
		}
	}
	for _, f := range []struct {
		to      *string
		pattern string
	}{{&fs.sleep, "drover-sleep-"}, {&fs.wait, "drover-wait-"}, {&fs.spawn, "drover-spawn-"}} {
		tf, err := os.CreateTemp("", f.pattern)
		if err != nil {
			done()
			return fs, nil, err
		}
		tf.Close()
		*f.to = tf.Name()
		made = append(made, tf.Name())
	}
	return fs, done, nil
}

// env names the files to the step.
func (fs stepFiles) env() []string {
	return []string{"DROVER_SLEEP_FILE=" + fs.sleep, "DROVER_WAIT_FILE=" + fs.wait, "DROVER_SPAWN_FILE=" + fs.spawn}
}

// end reads what the step wrote to its files: out is its state, and the
// error a sleep, a wait or a spawn it ends with (nil: none), or the error
// that fails it (more than one, or one that is not valid).
func (fs stepFiles) end(out []byte) ([]byte, error) {
	sleep, err := task.ReadStepFile(fs.sleep, "DROVER_SLEEP_FILE", 1<<10)
	if err != nil {
		return nil, err
	}
	wait, err := task.ReadStepFile(fs.wait, "DROVER_WAIT_FILE", 1<<10)
	if err != nil {
		return nil, err
	}
	spawn, err := task.ReadStepFile(fs.spawn, "DROVER_SPAWN_FILE", maxSpawnFile)
	if err != nil {
		return nil, err
	}
	sleep, wait, spawn = bytes.TrimSpace(sleep), bytes.TrimSpace(wait), bytes.TrimSpace(spawn)
	ends := 0
	for _, b := range [][]byte{sleep, wait, spawn} {
		if len(b) > 0 {
			ends++
		}
	}
	var req error
	switch {
	case ends > 1:
		return nil, &drover.InputError{Field: "DROVER_SPAWN_FILE", Rule: "a step ends with one of a sleep (DROVER_SLEEP_FILE), a wait (DROVER_WAIT_FILE) or a spawn (DROVER_SPAWN_FILE), not more"}
	case len(spawn) > 0:
		sp, err := parseSpawnFile(spawn)
		if err != nil {
			return nil, err
		}
		req = sp // the step ends by spawning children
	case len(sleep) > 0:
		sl, err := task.ParseSleep("DROVER_SLEEP_FILE", string(sleep))
		if err != nil {
			return nil, err
		}
		req = sl // the step ends with a sleep
	case len(wait) > 0:
		wr, err := task.ParseWaitText("DROVER_WAIT_FILE", string(wait))
		if err != nil {
			return nil, err
		}
		req = wr // the step ends with a wait for a signal
	}
	return out, req
}

// step returns the function of step n, name, which runs script with sh -c.
func (sr *stepRunner) step(n int, name, script string) task.StepFunc {
	a, id := sr.a, sr.id
	return func(sctx context.Context, state []byte) ([]byte, error) {
		files, filesDone, err := newStepFiles()
		if err != nil {
			return nil, err
		}
		defer filesDone()
		sigFile, done, err := signalFile(sctx)
		if err != nil {
			return nil, err
		}
		defer done()
		kidsFile, kidsDone, err := childrenFile(sctx)
		if err != nil {
			return nil, err
		}
		defer kidsDone()
		c := exec.Command("sh", "-c", script)
		c.Env = append(stepEnv(os.Environ()), EnvTaskID+"="+id, EnvStep+"="+strconv.Itoa(n), EnvStepName+"="+name,
			EnvLockToken+"="+strconv.FormatInt(sr.token, 10))
		c.Env = append(c.Env, files.env()...)
		c.Env = append(c.Env, a.childEnv()...) // drover emit reaches the same etcd and namespace
		stream.Elsewhere(sctx)                 // the step may emit (drover emit): its end is written
		if sigFile != "" {
			sg, _ := task.ReceivedSignal(sctx)
			c.Env = append(c.Env, "DROVER_SIGNAL_FILE="+sigFile, "DROVER_SIGNAL_NAME="+sg.Name)
		}
		if kidsFile != "" {
			c.Env = append(c.Env, "DROVER_CHILDREN_FILE="+kidsFile)
		}
		c.Stdin = bytes.NewReader(state)
		out := &limitedBuffer{limit: task.DefaultStateLimit}
		c.Stdout, c.Stderr = out, a.stderr
		if sctx.Err() != nil {
			return nil, context.Cause(sctx) // interrupted or lost before the step began
		}
		sr.inStep.Store(true)
		defer sr.inStep.Store(false)
		waitErr, stopped, startErr := proc.Supervise(c, sr.sigs, sctx.Done(), sr.grace, func() {
			fmt.Fprintf(a.stderr, "drover: task %s step %d (%s): %v; stopping it (SIGTERM, SIGKILL after %s)\n", id, n, name, context.Cause(sctx), sr.grace)
		})
		switch {
		case startErr != nil:
			return nil, startErr
		case stopped:
			sr.lost = errors.Is(context.Cause(sctx), lock.ErrLost)
			return nil, context.Cause(sctx)
		case waitErr != nil:
			return nil, fmt.Errorf("%s: %w", script, waitErr)
		case out.over:
			return nil, &task.StateTooLargeError{TaskID: id, Step: n, Name: name, Size: out.n, Limit: out.limit}
		}
		return files.end(out.Bytes())
	}
}

// stepEnv is the environment a step inherits: task.InheritedEnv's, less
// an outer claim's (a queue's exec handler running drover task run), so
// that drover emit in the step writes under the task's lock.
func stepEnv(environ []string) []string {
	return slices.DeleteFunc(task.InheritedEnv(environ), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == "DROVER_QUEUE" || name == "DROVER_CLAIM_TOKEN"
	})
}

// signalFile writes the signal a step resumes with (none: "") to a file
// for it, and returns the file's name.
func signalFile(ctx context.Context) (string, func(), error) {
	sg, ok := task.ReceivedSignal(ctx)
	if !ok {
		return "", func() {}, nil
	}
	f, err := os.CreateTemp("", "drover-signal-")
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	done := func() { os.Remove(f.Name()) }
	if err := json.NewEncoder(f).Encode(sg); err != nil {
		done()
		return "", nil, err
	}
	return f.Name(), done, nil
}

// Child tasks of drover task run: a step that writes children to
// DROVER_SPAWN_FILE ends by spawning them (task.Spawn, the same plan,
// once-only submission and ids as a queue task's exec step); the run
// stops, holding nothing, until they ended, and the next step reads their
// outcomes from DROVER_CHILDREN_FILE.

// maxSpawnFile bounds what is read of a spawn file.
const maxSpawnFile = 64 << 20

// spawnFileJSON is what a step writes to DROVER_SPAWN_FILE, as an exec
// step of a queue task does.
type spawnFileJSON struct {
	Children []struct {
		task.Child
		Timeout string `json:"timeout,omitempty"`
	} `json:"children"`
	Wait    int  `json:"wait,omitempty"`
	Collect bool `json:"collect,omitempty"`
}

// parseSpawnFile reads what a step wrote to DROVER_SPAWN_FILE: the
// children to spawn and how to wait for them. The children themselves
// (queues, keys, fields) are checked when the step's checkpoint is
// written; an error there is renamed to name the file.
func parseSpawnFile(b []byte) (*task.SpawnRequest, error) {
	const field = "DROVER_SPAWN_FILE"
	var sf spawnFileJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sf); err != nil {
		return nil, &drover.InputError{Field: field, Rule: "must be JSON: {\"children\": [{\"queue\", \"task_type\", ...}], \"wait\", \"collect\"}: " + err.Error()}
	}
	req := &task.SpawnRequest{Children: make([]task.Child, len(sf.Children)), Options: task.SpawnOptions{Wait: sf.Wait, Collect: sf.Collect}}
	for i, c := range sf.Children {
		req.Children[i] = c.Child
		if c.Timeout != "" {
			f := fmt.Sprintf("%s children[%d].timeout", field, i)
			sl, err := task.ParseSleep(f, c.Timeout)
			if err != nil || sl.For <= 0 {
				return nil, &drover.InputError{Field: f, Value: c.Timeout, Rule: "must be a positive duration such as 10m, or a number of seconds"}
			}
			req.Children[i].Timeout = sl.For
		}
	}
	return req, nil
}

// spawnError names the spawn file in an input error of a spawn (a queue
// that does not exist: "DROVER_SPAWN_FILE children[0].queue").
func spawnError(err error) error {
	var ie *drover.InputError
	if errors.As(err, &ie) && (strings.HasPrefix(ie.Field, "children") || ie.Field == "wait") {
		return ie.Renamed("DROVER_SPAWN_FILE " + ie.Field)
	}
	return err
}

// childrenFile writes the outcomes of the children the step before spawned
// (none: "") to a file, a JSON array of {"id", "status", "result",
// "error"} in id order, a page at a time, and returns its name.
func childrenFile(ctx context.Context) (name string, done func(), err error) {
	page, next, err := task.ChildrenPage(ctx, "", 500)
	if err != nil || len(page) == 0 {
		return "", func() {}, err
	}
	f, err := os.CreateTemp("", "drover-children-")
	if err != nil {
		return "", nil, err
	}
	done = func() { os.Remove(f.Name()) }
	w := bufio.NewWriter(f)
	sep := "["
	for i := 0; ; i++ {
		for j := range page {
			b, merr := json.Marshal(&page[j])
			if merr != nil {
				err = merr
				break
			}
			_, _ = w.WriteString(sep)
			_, _ = w.Write(b)
			sep = ","
		}
		if err != nil || next == "" || i > 100_000 {
			break
		}
		if page, next, err = task.ChildrenPage(ctx, next, 500); err != nil {
			break
		}
	}
	_, _ = w.WriteString("]\n")
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		done()
		return "", nil, err
	}
	return f.Name(), done, nil
}
