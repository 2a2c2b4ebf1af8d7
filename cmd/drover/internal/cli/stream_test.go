package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
)

// emitScript is an exec handler that emits events with drover emit: many
// in its first attempt (it is killed meanwhile), five in a later one.
const emitScript = `n=100000; [ "$DROVER_ATTEMPT" -gt 1 ] && n=5
i=0
while [ $i -lt $n ]; do
  "$DROVER_BIN" emit --type log --data "{\"i\": $i}" || exit 1
  i=$((i+1))
done
echo '"ok"'
`

// TestEmitKilledWorkerTakeover: a worker whose exec handler emits with
// drover emit is SIGKILLed mid-stream; its orphaned command keeps
// emitting until the claim is gone (then drover emit fails), another
// worker takes the task over, and a follower sees the first attempt's
// events, the boundary, then only the second attempt's, and done.
func TestEmitKilledWorkerTakeover(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	retries := 3
	if _, err := c.Submit(ctx, "talk", []queue.Task{{ID: "chat-1", Type: "chat", MaxRetries: &retries}}, nil); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "emit.sh")
	if err := os.WriteFile(script, []byte(emitScript), 0o755); err != nil {
		t.Fatal(err)
	}
	args := append(etcdFlags(ns), "worker", "--queue", "talk", "--concurrency", "1", "--ttl", "2s",
		"--backoff-base", "10ms", "--backoff-max", "20ms", "--handler", "exec:sh "+script)
	env := cleanEnv("DROVER_BIN=" + droverBin)
	first := start(t, env, args...)

	hub := stream.NewHub(cli, keyspace.MustNew(ns))
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var got []stream.Event
	var second *process
	for ev, err := range hub.Follow(fctx, "chat-1", 0) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
		if len(got) == 6 && second == nil { // mid-stream: kill the worker, start another
			if err := first.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			second = start(t, env, args...)
		}
	}
	if fctx.Err() != nil {
		t.Fatalf("no done within a minute; %d events; second worker: %s", len(got), second.stderr.String())
	}
	lost := -1
	for i, ev := range got {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i+1, ev.Seq)
		}
		if ev.Type == stream.AttemptLost {
			if lost >= 0 {
				t.Fatalf("two boundaries, at %d and %d", lost+1, i+1)
			}
			lost = i
		}
		if lost >= 0 && ev.Attempt == 1 && ev.Type != stream.AttemptLost {
			t.Fatalf("event %d of the killed attempt after the boundary at %d: %+v", ev.Seq, lost+1, ev)
		}
	}
	if lost < 6 {
		t.Fatalf("boundary at %d, want after the 6 events seen before the kill", lost+1)
	}
	t.Logf("boundary at event %d of %d", lost+1, len(got))
	tail := got[lost:]
	if len(tail) != 9 || tail[1].Type != stream.AttemptStarted || tail[7].Type != stream.AttemptEnded || tail[8].Type != stream.Done || !strings.Contains(string(tail[8].Data), `"succeeded"`) {
		t.Fatalf("after the boundary: %+v", tail)
	}

	// drover tasks follow prints the same stream, as JSON lines.
	r := drover(t, append(etcdFlags(ns), "tasks", "follow", "chat-1", "--json", "--from", fmt.Sprint(lost+1))...)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != len(tail) {
		t.Fatalf("drover tasks follow: exit %d, %d lines, want %d: %s%s", r.code, len(lines), len(tail), r.stdout, r.stderr)
	}
	var ev stream.Event
	if err := json.Unmarshal([]byte(lines[0]), &ev); err != nil || ev.Type != stream.AttemptLost {
		t.Fatalf("first line %q: %v", lines[0], err)
	}
}

// TestEmitRefusesBadInput: emit outside an exec handler, or with bad
// flags, is a usage error that stores nothing.
func TestEmitRefusesBadInput(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"emit", "--text", "x"}, "$DROVER_TASK_ID is not set"},
		{[]string{"emit", "--data", "{", "--text", "x"}, "cannot be used together"},
		{[]string{"emit", "--data", "{"}, "--data"},
		{[]string{"tasks", "follow", "nope"}, "no such task"},
	} {
		r := drover(t, append(etcdFlags(ns), tc.args...)...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want a failure saying %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
