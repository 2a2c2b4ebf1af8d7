package cli_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cmd/drover/internal/cli"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// writeFillBatch writes a JSONL file of n tasks of batch b, each with about
// 2 KB of random text in its input_data_uri (submissions are compressed:
// the text must not compress away), and returns its path.
func writeFillBatch(t *testing.T, dir string, rng *rand.Rand, b, n int) string {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("batch-%03d.jsonl", b))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	raw := make([]byte, 1500)
	for i := 0; i < n; i++ {
		for k := range raw {
			raw[k] = byte(rng.Uint32())
		}
		line, _ := json.Marshal(map[string]string{"task_id": fmt.Sprintf("b%03d-t%04d", b, i), "task_type": "fill",
			"input_data_uri": "s3://bucket/inputs/" + base64.RawURLEncoding.EncodeToString(raw)})
		w.Write(line)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

var submittedOf = regexp.MustCompile(`\((\d+) of 1000 submitted; submitting again is safe`)

// TestSubmitExitsBusyWhileStoreFull: a real `drover server` with a 64 MiB
// quota and a 30 % high-water mark (its guard checks every 2 s while
// submissions go on: the room above the mark takes what comes in between).
// `drover submit --file` of 1,000-task files goes on until it exits 75,
// saying how full the store is (usage, quota), what to do, and how many of
// the file's tasks went in, which `drover tasks stats` confirms. While the
// store is full `drover lock run` (a lease, a lock) still works and `drover
// task run` exits 75 (its checkpoint is refused). Once `drover tasks purge
// --status PENDING --all` has deleted the tasks, the server's guard clears
// the key and `drover submit` and `drover task run` exit 0 again.
func TestSubmitExitsBusyWhileStoreFull(t *testing.T) {
	began := time.Now()
	const quota = 64 << 20
	ns := etcdtest.Namespace(t)
	args := append(serverArgs(filepath.Join(t.TempDir(), "data")), "--namespace", ns,
		"--quota-backend-bytes", fmt.Sprint(quota), "--high-water", "30%", "--low-water", "20%")
	p := start(t, cleanEnv(), args...)
	waitFor(t, 30*time.Second, "the server ready", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
	endpoint := readyEndpoint(p)
	flags := []string{"--etcd-endpoints", endpoint, "--namespace", ns}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 8))

	submitted, batches := 0, 0
	var full result
	for b := 0; b < 40 && full.code == 0; b++ {
		r := drover(t, append(flags, "submit", "--queue", "fill", "--file", writeFillBatch(t, dir, rng, b, 1000), "--json")...)
		switch r.code {
		case 0:
			var out submitOut
			if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Submitted != 1000 {
				t.Fatalf("batch %d: %q (%v), want 1000 submitted", b, r.stdout, err)
			}
			submitted += out.Submitted
			batches++
		case cli.ExitBusy:
			full = r
		default:
			t.Fatalf("batch %d, after %d tasks: exit %d, stderr %q; want 0 or %d\nserver:\n%s", b, submitted, r.code, r.stderr, cli.ExitBusy, p.stderr.String())
		}
	}
	if full.code == 0 {
		t.Fatalf("40 files of 1,000 tasks went in and the store never filled\nserver:\n%s", p.stderr.String())
	}
	t.Logf("%d files in, then exit 75 (%s): %s", batches, time.Since(began).Round(time.Millisecond), strings.TrimSpace(full.stderr))
	for _, want := range []string{"store full: etcd's database uses ", " MiB of its 64.0 MiB quota", "past the 30% high-water mark",
		"leases and locks keep working", "drover tasks purge --queue Q --status SUCCEEDED --all", "--quota-backend-bytes",
		"writes resume once less than 20% is in use"} {
		if !strings.Contains(full.stderr, want) {
			t.Fatalf("submit on a full store: stderr %q does not say %q", full.stderr, want)
		}
	}
	m := submittedOf.FindStringSubmatch(full.stderr)
	if m == nil {
		t.Fatalf("submit on a full store: stderr %q does not say how many of the file's tasks went in", full.stderr)
	}
	n, _ := strconv.Atoi(m[1])
	submitted += n
	r := drover(t, append(flags, "tasks", "stats", "--queue", "fill", "--json")...)
	want := fmt.Sprintf(`{"pending":%d,"running":0,"retrying":0,"succeeded":0,"dead":0,"cancelled":0,"scheduled":0,"paused":false,"sleeping":0,"waiting":0}`, submitted)
	if r.code != 0 || strings.TrimSpace(r.stdout) != want {
		t.Fatalf("stats of the full queue: exit %d, %q; want %s", r.code, r.stdout, want)
	}
	for _, want := range []string{"past the high-water mark", "quota_mib=64"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Fatalf("the server's log does not say %q:\n%s", want, p.stderr.String())
		}
	}
	if strings.Contains(p.stderr.String(), "NOSPACE") {
		t.Fatalf("etcd's NOSPACE alarm was raised:\n%s", p.stderr.String())
	}

	// The control plane works: a lease and a lock. A task runner's
	// checkpoint is data plane: refused, exit 75.
	if r := drover(t, append(flags, "lock", "run", "report", "--wait", "0", "--ttl", "5s", "--", "true")...); r.code != 0 {
		t.Fatalf("lock run on a full store: exit %d, stderr %q", r.code, r.stderr)
	}
	r = drover(t, append(flags, "task", "run", "report-1", "--ttl", "5s", "--step", "a=echo state")...)
	if r.code != cli.ExitBusy || !strings.Contains(r.stderr, "checkpoint step 1") || !strings.Contains(r.stderr, "64.0 MiB quota") {
		t.Fatalf("task run on a full store: exit %d, stderr %q; want %d naming the quota", r.code, r.stderr, cli.ExitBusy)
	}

	// Free space as the error says; the guard does the rest.
	r = drover(t, append(flags, "tasks", "purge", "--queue", "fill", "--status", "PENDING", "--all")...)
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("purged %d tasks", submitted)) {
		t.Fatalf("purge: exit %d, stdout %q, stderr %q; want %d purged", r.code, r.stdout, r.stderr, submitted)
	}
	purged := time.Now()
	cleared := func() bool { return strings.Contains(p.stderr.String(), "accepted again") }
	if !etcdtest.Eventually(20*time.Second, cleared) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := connectTo(ctx, t, endpoint)
		segs := keyspace.MustNew(ns).Segments("fill")
		g, err := c.Get(ctx, segs, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		t.Errorf("the guard did not clear the key within 20 s of `drover tasks purge` (%d tasks purged): %d segment keys are left under %s, "+
			"which purge does not delete\nserver:\n%s", submitted, g.Count, segs, p.stderr.String())
		// Go on with a pure deletion of the segments, to check the rest.
		if _, err := c.Delete(ctx, segs, clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
		if !etcdtest.Eventually(20*time.Second, cleared) {
			t.Fatalf("the guard did not clear the key with the segments deleted too\nserver:\n%s", p.stderr.String())
		}
	}
	t.Logf("the guard cleared the key %s after the purge", time.Since(purged).Round(time.Millisecond))
	r = drover(t, append(flags, "submit", "--queue", "fill", "--file", writeFillBatch(t, dir, rng, 999, 1000), "--json")...)
	if r.code != 0 || !strings.Contains(r.stdout, `"submitted":1000`) {
		t.Fatalf("submit once the guard cleared the key: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := drover(t, append(flags, "task", "run", "report-1", "--ttl", "5s", "--step", "a=echo state")...); r.code != 0 {
		t.Fatalf("task run once the guard cleared the key: exit %d, stderr %q", r.code, r.stderr)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("server: exit %d; stderr:\n%s", code, p.stderr.String())
	}
	t.Logf("took %s", time.Since(began).Round(time.Millisecond))
}
