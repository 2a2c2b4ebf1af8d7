package cli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cmd/drover/internal/cli"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// burstBodies are n submissions of 10 tasks each (ids from first on),
// each task with 45 KB of random bytes in its parameters (base64:
// submissions are compressed, the bytes must not compress away): 450 KB a
// batch in etcd's database.
func burstBodies(first, n int) [][]byte {
	rng := rand.NewChaCha8([32]byte{36, byte(first)})
	raw := make([]byte, 45_000)
	out := make([][]byte, n)
	for b := range out {
		tasks := make([]map[string]any, 10)
		for i := range tasks {
			_, _ = rng.Read(raw)
			tasks[i] = map[string]any{"task_id": fmt.Sprintf("burst-%03d-%02d", first+b, i), "task_type": "fill",
				"parameters": map[string]string{"blob": base64.RawStdEncoding.EncodeToString(raw)}}
		}
		out[b], _ = json.Marshal(tasks)
	}
	return out
}

// post sends body to the HTTP API at addr in namespace ns and returns the
// status and the decoded answer.
func post(t *testing.T, addr, ns, path string, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Drover-Namespace", ns)
	r, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", path, err)
		return 0, nil
	}
	defer r.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(r.Body).Decode(&out)
	return r.StatusCode, out
}

// readyz is the server's /readyz: status and answer.
func readyz(t *testing.T, addr string) (int, map[string]any) {
	t.Helper()
	r, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(r.Body).Decode(&out)
	return r.StatusCode, out
}

// TestServerBurstYieldsBeforeNOSPACE: the burst that once reached etcd's
// NOSPACE alarm. A `drover server` with a 16 MiB quota (embedded, or in
// front of an etcd the test runs apart from it) takes batches of 10 tasks
// of 45 KB back to back over HTTP: 36 from one submitter, or 48 from 6 at
// once while sessions are created (each granted). Each answer is 200 or a
// 507 store-full problem, never a NOSPACE one, and some are 507; etcd
// raises no alarm. One submitter then goes on
// until the guard sets its key (on a refusal), still without an alarm: a
// session is granted and takes a lock, /readyz says ready with
// store_full, and `drover submit` straight to etcd exits 75.
func TestServerBurstYieldsBeforeNOSPACE(t *testing.T) {
	const quota = 16 << 20
	for _, tc := range []struct {
		mode       string
		submitters int
		batches    int
	}{{"embedded", 1, 36}, {"embedded", 6, 48}, {"external", 1, 36}, {"external", 6, 48}} {
		t.Run(fmt.Sprintf("%s/%d-submitters", tc.mode, tc.submitters), func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			addr := "127.0.0.1:" + port(t)
			args := []string{"--namespace", ns, "--http-listen", addr}
			var endpoint string
			if tc.mode == "embedded" {
				args = append(append(serverArgs(filepath.Join(t.TempDir(), "data")), args...), "--quota-backend-bytes", fmt.Sprint(quota))
			} else {
				srv, _ := etcdtest.QuotaServer(t, quota)
				endpoint = srv.Endpoints()[0]
				args = append([]string{"server", "--etcd-endpoints", endpoint}, args...)
			}
			p := start(t, cleanEnv(), args...)
			waitFor(t, 30*time.Second, "the server ready", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
			if tc.mode == "embedded" {
				endpoint = readyEndpoint(p)
			}
			// The external server's guards start once they list the members.
			waitFor(t, 30*time.Second, "the store guard", func() bool {
				return tc.mode == "embedded" || strings.Contains(p.stderr.String(), "guarding the cluster's members")
			})
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			c := connectTo(ctx, t, endpoint)
			if n := burst(t, addr, ns, tc.submitters, burstBodies(0, tc.batches)); n == 0 {
				t.Fatalf("no submission of %d was refused\nserver:\n%s", tc.batches, p.stderr.String())
			}
			if al, err := c.AlarmList(ctx); err != nil || len(al.Alarms) != 0 {
				t.Fatalf("etcd's alarms after the burst: %v, %v\nserver:\n%s", al, err, p.stderr.String())
			}
			// During a burst the server counts what etcd has not measured
			// yet: it may refuse below the mark, and the store takes more
			// once the burst is over. One submitter goes on until the
			// store is full: the guard sets its key on a refusal past the
			// low-water mark (the bound only keeps a broken server from
			// hanging the test).
			guardKey := keyspace.MustNew(ns).StoreFull()
			for b, deadline := tc.batches, time.Now().Add(60*time.Second); ; b++ {
				if g, err := c.Get(ctx, guardKey, clientv3.WithCountOnly()); err != nil || g.Count == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the guard key is not set after %d batches\nserver:\n%s", b, p.stderr.String())
				}
				burst(t, addr, ns, 1, burstBodies(b, 1))
			}
			if al, err := c.AlarmList(ctx); err != nil || len(al.Alarms) != 0 {
				t.Fatalf("etcd's alarms once the store is full: %v, %v\nserver:\n%s", al, err, p.stderr.String())
			}
			code, sess := post(t, addr, ns, "/v1/sessions", []byte(`{"ttl":10}`))
			if code != 201 {
				t.Fatalf("session after the burst: %d %v", code, sess)
			}
			if code, out := post(t, addr, ns, "/v1/locks/after-burst", []byte(`{"session":"`+sess["id"].(string)+`"}`)); code != 200 {
				t.Fatalf("lock after the burst: %d %v", code, out)
			}
			// The guard may clear its key again between two reads (its
			// compaction and defragmentation can take usage under the
			// low-water mark): /readyz must say store_full, and a direct
			// `drover submit` must exit 75, whenever the key is set both
			// before and after each answers.
			for b, agreed := tc.batches, false; !agreed; b++ {
				if b > tc.batches+40 {
					t.Fatalf("the guard key did not stay set across /readyz and a submit in 40 batches\nserver:\n%s", p.stderr.String())
				}
				if keyCount(ctx, t, c, guardKey) == 0 {
					burst(t, addr, ns, 1, burstBodies(b, 1))
					continue
				}
				code, out := readyz(t, addr)
				if code != 200 {
					t.Fatalf("/readyz on the full store: %d %v; want 200 (ready)", code, out)
				}
				file := filepath.Join(t.TempDir(), "one.jsonl")
				if err := os.WriteFile(file, []byte(fmt.Sprintf(`{"task_id":"direct-%d","task_type":"fill"}`+"\n", b)), 0o600); err != nil {
					t.Fatal(err)
				}
				r := drover(t, "--etcd-endpoints", endpoint, "--namespace", ns, "submit", "--queue", "full", "--file", file)
				if keyCount(ctx, t, c, guardKey) == 0 {
					continue // cleared meanwhile: the answers prove nothing
				}
				if out["store_full"] != true {
					t.Fatalf("/readyz while the guard key is set: %v; want store_full", out)
				}
				if r.code != cli.ExitBusy || !strings.Contains(r.stderr, "store full") {
					t.Fatalf("drover submit on the full store: exit %d, stderr %q; want %d", r.code, r.stderr, cli.ExitBusy)
				}
				agreed = true
			}
			if strings.Contains(p.stderr.String(), "NOSPACE alarm is raised") {
				t.Fatalf("the server saw etcd's NOSPACE alarm:\n%s", p.stderr.String())
			}
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			if code := p.wait(t, 20*time.Second); code != 0 {
				t.Fatalf("server: exit %d; stderr:\n%s", code, p.stderr.String())
			}
		})
	}
}

// burst posts bodies to queue "full" from n submitters at once and
// returns how many were refused; every answer must be 200 or a 507
// store-full problem. With several submitters, sessions are created
// meanwhile, each one 201.
func burst(t *testing.T, addr, ns string, n int, bodies [][]byte) int {
	t.Helper()
	var mu sync.Mutex
	in, refused := 0, 0
	var wg sync.WaitGroup
	if n > 1 { // the control plane works during the burst
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				if code, out := post(t, addr, ns, "/v1/sessions", []byte(`{"ttl":10}`)); code != 201 {
					t.Errorf("session during the burst: %d %v", code, out)
				}
			}
		}()
	}
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := w; b < len(bodies); b += n {
				code, out := post(t, addr, ns, "/v1/queues/full/tasks", bodies[b])
				mu.Lock()
				switch {
				case code == 200:
					in++
				case code == 507 && out["type"] == "https://drover.dev/problems/store-full" && !strings.Contains(fmt.Sprint(out["detail"]), "NOSPACE"):
					refused++
				default:
					t.Errorf("batch %d: %d %v; want 200 or a 507 store-full problem", b, code, out)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(bodies) > 1 {
		t.Logf("%d batches in, %d refused (507)", in, refused)
	}
	return refused
}

// TestSubmitExitsBusyOnNOSPACE: with etcd's NOSPACE alarm raised (no
// drover server guards this etcd: a writer filled it), `drover submit`
// exits 75 saying the store is full and what to do, as the guard's own
// refusal does; it used to exit 1.
func TestSubmitExitsBusyOnNOSPACE(t *testing.T) {
	srv, c := etcdtest.QuotaServer(t, 16<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	big := strings.Repeat("x", 1<<20)
	var err error
	for i := 0; i < 40 && err == nil; i++ {
		_, err = c.Put(ctx, fmt.Sprintf("/filler/%03d", i), big)
	}
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("filling a 16 MiB store: %v, want %v", err, rpctypes.ErrNoSpace)
	}
	r := drover(t, "--etcd-endpoints", srv.Endpoints()[0], "--namespace", etcdtest.Namespace(t), "submit", "--queue", "q", "--type", "x")
	if r.code != cli.ExitBusy || !strings.Contains(r.stderr, "NOSPACE") || !strings.Contains(r.stderr, "drover tasks purge") {
		t.Fatalf("drover submit under NOSPACE: exit %d, stderr %q; want %d with advice", r.code, r.stderr, cli.ExitBusy)
	}
}

// keyCount is how many keys key names (0 or 1).
func keyCount(ctx context.Context, t *testing.T, c *clientv3.Client, key string) int64 {
	t.Helper()
	g, err := c.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return g.Count
}
