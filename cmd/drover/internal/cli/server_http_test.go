package cli_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cmd/drover/internal/cli"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestServerHTTPFlags: the HTTP flags are checked before anything starts:
// a non-loopback address without --auth-file, a certificate without its
// key, auth or TLS without --http-listen and a bad auth file each exit 2
// saying what to do.
func TestServerHTTPFlags(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(bad, []byte(`{"tokens":[{"token":"short","namespaces":["drover"],"role":"read"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--http-listen", "0.0.0.0:" + port(t)}, "refusing to serve the HTTP API on 0.0.0.0"},
		{[]string{"--http-listen", "127.0.0.1:" + port(t), "--tls-cert", "c.pem"}, "invalid --tls-cert \"c.pem\": needs --tls-key"},
		{[]string{"--auth-file", bad}, "--auth-file needs --http-listen"},
		{[]string{"--http-listen", "127.0.0.1:" + port(t), "--auth-file", bad}, "tokens[0].token"},
		{[]string{"--http-listen", "nonsense"}, "invalid --http-listen \"nonsense\": must be host:port"},
		{[]string{"--http-listen", "127.0.0.1:" + port(t), "--http-request-timeout", "-1s"}, "invalid --http-request-timeout \"-1s\": must be a duration"},
		{[]string{"--http-listen", "127.0.0.1:" + port(t), "--tls-cert", bad, "--tls-key", bad}, "give a PEM certificate and its private key"},
	} {
		r := drover(t, append(serverArgs(filepath.Join(dir, "data")), tc.args...)...)
		if r.code != cli.ExitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Fatalf("server %v: exit %d, stderr %q; want exit 2 saying %q", tc.args, r.code, r.stderr, tc.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
			t.Fatalf("server %v wrote its data dir before refusing", tc.args)
		}
	}
}

func port(t *testing.T) string {
	t.Helper()
	_, p, _ := strings.Cut(etcdtest.FreeAddr(), ":")
	return p
}

// TestSecondServerServesSession: a session created through one drover
// server (embedded etcd) is kept alive, and holds a lock, through a second
// server in front of the same etcd (--etcd-endpoints): no client state
// lives in a server.
func TestSecondServerServesSession(t *testing.T) {
	etcdURL := "http://" + etcdtest.FreeAddr()
	httpA, httpB := "127.0.0.1:"+port(t), "127.0.0.1:"+port(t)
	a := start(t, cleanEnv(), "server", "--data-dir", filepath.Join(t.TempDir(), "data"), "--etcd-listen", etcdURL,
		"--etcd-peer-listen", "http://"+etcdtest.FreeAddr(), "--http-listen", httpA)
	waitFor(t, 30*time.Second, "the first server ready", func() bool { return strings.Contains(a.stderr.String(), "HTTP API ready") })
	b := start(t, cleanEnv(), "server", "--etcd-endpoints", etcdURL, "--http-listen", httpB)
	waitFor(t, 30*time.Second, "the second server ready", func() bool { return strings.Contains(b.stderr.String(), "HTTP API ready") })

	post := func(addr, path string, body any) (int, map[string]any) {
		raw, _ := json.Marshal(body)
		r, err := http.Post("http://"+addr+path, "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(r.Body).Decode(&out)
		return r.StatusCode, out
	}
	code, sess := post(httpA, "/v1/sessions", map[string]any{"ttl": 10})
	if code != 201 {
		t.Fatalf("create session on the first server: %d %v", code, sess)
	}
	id := sess["id"].(string)
	if code, out := post(httpB, "/v1/sessions/"+id+"/keepalive", nil); code != 200 {
		t.Fatalf("keepalive on the second server: %d %v", code, out)
	}
	if code, out := post(httpB, "/v1/locks/shared", map[string]any{"session": id}); code != 200 {
		t.Fatalf("lock under the session on the second server: %d %v", code, out)
	}
	if code, out := post(httpA, "/v1/locks/shared", map[string]any{"owner": "other", "ttl": 5}); code != 409 {
		t.Fatalf("the lock seen from the first server: %d %v, want 409", code, out)
	}
	for _, p := range []*process{b, a} {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("server exit %d:\n%s", code, p.stderr.String())
		}
	}
}
