package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxWrites bounds how many rounds a test's writer makes (it is stopped
// long before).
const maxWrites = 1_000_000

// writer puts keys one after another until stopped, and records the
// revision etcd acknowledged each at.
type writer struct {
	mu    sync.Mutex
	acked map[string]int64
	stop  chan struct{}
	done  chan struct{}
}

func startWriter(t *testing.T, cli *clientv3.Client, prefix string) *writer {
	t.Helper()
	w := &writer{acked: map[string]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		val := strings.Repeat("v", 1024)
		for i := 0; i < maxWrites; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			key := fmt.Sprintf("%s%06d", prefix, i)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := cli.Put(ctx, key, val)
			cancel()
			if err != nil {
				continue // not acknowledged: it may or may not be in the backup
			}
			w.mu.Lock()
			w.acked[key] = resp.Header.Revision
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.halt)
	return w
}

func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

func (w *writer) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// fenceToken runs `drover lock run fence` against endpoint and returns the
// token it was given.
func fenceToken(t *testing.T, endpoint string) int64 {
	t.Helper()
	r := drover(t, "--etcd-endpoints", endpoint, "lock", "run", "fence", "--", "sh", "-c", `echo "$DROVER_LOCK_TOKEN"`)
	tok, err := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64)
	if r.code != 0 || err != nil {
		t.Fatalf("lock run fence: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	return tok
}

// TestBackupRestore: `drover backup` of a server under load, then `drover
// restore` into a new data dir and a server on it. Meanwhile one writer
// puts keys, each recorded with the revision of its Put's response (the
// revision it was written at), and another submits, claims and acks tasks
// (queue's Claim and Ack) and writes checkpoints. Neither API returns the
// revision of its write, so each task acked and each checkpoint written
// is recorded with the revision read right after its acknowledgement (a
// linearizable read): at or above the revision the write was made at. A
// task or checkpoint whose recorded revision is at or below the backup's
// was therefore written at or below it, and must be on the restored
// server: the task SUCCEEDED with its result, the checkpoint with its
// state. The bound is conservative: work acknowledged just before the
// backup's revision may be recorded above it, and is then not checked
// (it is not required to be absent either).
//
// Every key acknowledged at or before the backup's revision is there,
// none after it; the restored server's revision is the backup's plus the
// bump the restore reported, marked compacted; a lock's fencing token is
// higher than every token and revision before. A restore into a data dir
// that holds files, and one of a file whose checksum does not match, are
// refused.
func TestBackupRestore(t *testing.T) {
	dir := t.TempDir()
	src := newMember(t, "drover")
	src.p = start(t, cleanEnv(), "server", "--data-dir", src.dataDir, "--etcd-listen", src.client, "--etcd-peer-listen", src.peer)
	src.waitReady(t)
	before := fenceToken(t, src.client)
	cli, err := cluster.Connect(context.Background(), cluster.ClientConfig{Endpoints: []string{src.client}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	w := startWriter(t, cli, "/backup-test/")
	work := startWorkWriter(t, cli)
	waitFor(t, 10*time.Second, "200 writes", func() bool { return w.count() >= 200 })
	waitFor(t, 20*time.Second, "20 tasks and checkpoints", func() bool { n, c := work.counts(); return n >= 20 && c >= 20 })
	file := filepath.Join(dir, "drover.db")
	r := drover(t, "--etcd-endpoints", src.client, "backup", file, "--json")
	var b struct {
		Bytes      int64  `json:"bytes"`
		SHA256     string `json:"sha256"`
		SHA256File string `json:"sha256_file"`
		Revision   int64  `json:"revision"`
		TookMS     int64  `json:"took_ms"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &b) != nil || b.Revision <= before || b.SHA256File != file+".sha256" {
		t.Fatalf("backup: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	t.Logf("backup under load: %d bytes, revision %d, %d ms", b.Bytes, b.Revision, b.TookMS)
	n := w.count()
	waitFor(t, 10*time.Second, "writes after the backup", func() bool { return w.count() >= n+50 })
	w.halt()
	work.halt()
	_ = src.p.cmd.Process.Signal(syscall.SIGTERM)
	src.p.wait(t, 20*time.Second)
	last := int64(0)
	for _, rev := range w.acked {
		last = max(last, rev)
	}

	restoreRefusals(t, dir, file)
	dst := newMember(t, "drover")
	r = drover(t, "restore", file, "--data-dir", dst.dataDir)
	var restoredRev int64
	if m := restoredFrom.FindStringSubmatch(r.stdout); m != nil {
		restoredRev, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if r.code != 0 || !strings.Contains(r.stdout, "sha256 verified") || restoredRev != b.Revision+cluster.DefaultRevisionBump {
		t.Fatalf("restore: exit %d, %q, %q; want revisions to go on from %d", r.code, r.stdout, r.stderr, b.Revision+cluster.DefaultRevisionBump)
	}
	dst.p = start(t, cleanEnv(), "server", "--data-dir", dst.dataDir, "--etcd-listen", dst.client, "--etcd-peer-listen", dst.peer)
	dst.waitReady(t)
	rcli, err := cluster.Connect(context.Background(), cluster.ClientConfig{Endpoints: []string{dst.client}})
	if err != nil {
		t.Fatal(err)
	}
	defer rcli.Close()
	g, err := rcli.Get(context.Background(), "/backup-test/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, kv := range g.Kvs {
		have[string(kv.Key)] = true
	}
	in := 0
	for key, rev := range w.acked {
		switch {
		case rev <= b.Revision && !have[key]:
			t.Fatalf("%s, acknowledged at revision %d, is missing from the backup of revision %d", key, rev, b.Revision)
		case rev > b.Revision && have[key]:
			t.Fatalf("%s, written at revision %d, is in the backup of revision %d", key, rev, b.Revision)
		case rev <= b.Revision:
			in++
		}
	}
	work.checkRestored(t, rcli, b.Revision)
	checkRestoredRevision(t, rcli, restoredRev)
	after := fenceToken(t, dst.client)
	t.Logf("%d of %d acknowledged keys in the backup; fencing token %d before the backup, %d after the restore (last write before it at revision %d)",
		in, len(w.acked), before, after, last)
	if after <= before || after <= last {
		t.Fatalf("fencing token after the restore %d: want above %d (before the backup) and %d (the last write)", after, before, last)
	}
}

// restoreRefusals: a restore into a data dir that holds files, and of a
// file whose checksum file does not match it, exit 2 and restore nothing.
func restoreRefusals(t *testing.T, dir, file string) {
	t.Helper()
	full := filepath.Join(dir, "full")
	if err := os.MkdirAll(filepath.Join(full, "member"), 0o700); err != nil {
		t.Fatal(err)
	}
	if r := drover(t, "restore", file, "--data-dir", full); r.code != 2 || !strings.Contains(r.stderr, `invalid --data-dir "`+full+`": must be a new or empty directory`) {
		t.Fatalf("restore into a data dir that holds files: exit %d, %q", r.code, r.stderr)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	copyFile := filepath.Join(dir, "copy.db")
	if err := os.WriteFile(copyFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyFile+".sha256", []byte(strings.Repeat("0", 64)+"  copy.db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "never")
	r := drover(t, "restore", copyFile, "--data-dir", target)
	if r.code != 2 || !strings.Contains(r.stderr, "says "+strings.Repeat("0", 64)+": the file is damaged or is not the backup that checksum belongs to") {
		t.Fatalf("restore with a wrong checksum: exit %d, %q", r.code, r.stderr)
	}
	if _, err := os.Stat(target); err == nil {
		t.Fatalf("a refused restore created %s", target)
	}
	if r := drover(t, "restore", copyFile); r.code != 2 || !strings.Contains(r.stderr, "invalid --data-dir") {
		t.Fatalf("restore without --data-dir: exit %d, %q", r.code, r.stderr)
	}
}

// restoredFrom finds the revision `drover restore` says revisions go on
// from.
var restoredFrom = regexp.MustCompile(`revisions go on from (\d+)`)

// checkRestoredRevision checks, through a client of the restored server,
// the revision the restore reported: the server serves at least it (the
// server may have written since it started), and it is marked compacted,
// so that a read below it is refused.
func checkRestoredRevision(t *testing.T, cli *clientv3.Client, rev int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := cli.Get(ctx, "/backup-test/", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(rev))
	if err != nil || g.Header.Revision < rev {
		t.Fatalf("read at the restored revision %d: %v, %v; want the server at or past it", rev, g, err)
	}
	if _, err := cli.Get(ctx, "/backup-test/", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(rev-1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("read at revision %d, below the restored one: %v; want it compacted", rev-1, err)
	}
}
