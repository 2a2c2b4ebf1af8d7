package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
)

// expandArgs is c's args as the kubelet hands them to the process: each
// $(VAR) replaced by the variable's value in a pod named podName (a
// variable from a Secret or a resource reads "x").
func expandArgs(c corev1.Container, podName string) []string {
	vals := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			vals[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			vals[e.Name] = podName
		default:
			vals[e.Name] = "x"
		}
	}
	out := make([]string, len(c.Args))
	for i, a := range c.Args {
		out[i] = envRef.ReplaceAllStringFunc(a, func(ref string) string {
			if v, ok := vals[envRef.FindStringSubmatch(ref)[1]]; ok {
				return v
			}
			return ref
		})
	}
	return out
}

// podName is the name of the first pod of d's workload: NAME-0 for a
// StatefulSet, NAME-HASH-ID for a Deployment.
func podName(d droverContainer) string {
	if d.w.sts != nil {
		return d.w.obj.GetName() + "-0"
	}
	return d.w.obj.GetName() + "-5d8f7c9b6d-x2k4q"
}

// The exit codes of drover's command line that these tests expect (its
// documented codes: docs/operations.md).
const (
	exitOK          = 0
	exitUnavailable = 69 // etcd could not be reached
)

// droverBin is the drover binary TestMain builds from this checkout.
var droverBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "drover-deploy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	droverBin = filepath.Join(dir, "drover")
	build := exec.Command("go", "build", "-o", droverBin, "github.com/droverhq/drover/cmd/drover")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building drover:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runDrover runs drover's command line as the container's entrypoint
// would, and returns its exit code and output.
func runDrover(args []string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	cmd := exec.Command(droverBin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(""), &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		code, errOut = -1, *bytes.NewBufferString(err.Error())
	}
	return code, out.String(), errOut.String()
}

// Every container's args, expanded as in the first pod, parse through
// drover's real command tree: the words name a command, and every flag is
// one that command takes with a value of its type. --help after them makes
// the command print its usage instead of running, but only once the flags
// before it have parsed; an unknown flag or a bad value fails with exit 2.
func TestEntrypointFlags(t *testing.T) {
	s := load(t)
	for _, d := range s.droverContainers(t) {
		t.Run(d.w.obj.GetName()+"/"+d.c.Name, func(t *testing.T) {
			args := expandArgs(d.c, podName(d))
			code, stdout, stderr := runDrover(append(slices.Clone(args), "--help"))
			if code != exitOK {
				t.Fatalf("%v: drover %s --help exited %d:\n%s", d, strings.Join(args, " "), code, stderr)
			}
			usage := "Usage:\n  drover " + strings.Join(d.path, " ")
			if !strings.Contains(stdout, usage) {
				t.Errorf("%v: the help printed is not drover %s's:\n%s", d, strings.Join(d.path, " "), stdout)
			}
		})
	}
}

// A worker with the manifest's args passes every check of its flags (the
// queue name, the handler, the durations, the flow-control specs) and gets
// as far as connecting to etcd: pointed at a closed loopback port instead
// of the members, it exits 69 (etcd unreachable), not 2 (usage).
func TestWorkerPassesItsChecks(t *testing.T) {
	s := load(t)
	for _, d := range s.command(t, "worker") {
		args := append(expandArgs(d.c, podName(d)),
			"--etcd-endpoints=127.0.0.1:1", "--dial-timeout=300ms", "--metrics-listen=127.0.0.1:0")
		if _, ok := d.flags["metrics-listen"]; !ok {
			args = args[:len(args)-1]
		}
		start := time.Now()
		code, _, stderr := runDrover(args)
		if code != exitUnavailable {
			t.Errorf("%v: exited %d after %v, want %d (etcd unreachable), having checked every flag:\n%s",
				d, code, time.Since(start).Round(time.Millisecond), exitUnavailable, stderr)
		}
	}
}

// The server's probes ask routes the HTTP API serves, and serves without a
// token under the manifests' auth file: the real routes answer each probe's
// path with neither 404 (no such route) nor 401 (a token wanted). /healthz
// answers 200; /readyz, with no etcd behind it, 503.
func TestProbesAreServed(t *testing.T) {
	s := load(t)
	for _, d := range s.command(t, "server") {
		secret := authSecret(t, s, d)
		auth, err := loadAuth(t, secret)
		if err != nil {
			t.Fatalf("%v: the auth file does not load: %v", d, err)
		}
		// A client of nothing: /readyz's read fails, which is its answer.
		etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := httpapi.New(httpapi.Config{Etcd: etcd, Auth: auth, Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []*corev1.Probe{d.c.StartupProbe, d.c.ReadinessProbe, d.c.LivenessProbe} {
			if p == nil || p.HTTPGet == nil {
				continue // TestServerCluster says so
			}
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p.HTTPGet.Path, nil))
			want := []int{http.StatusOK}
			if p.HTTPGet.Path == "/readyz" {
				want = append(want, http.StatusServiceUnavailable)
			}
			if !slices.Contains(want, rec.Code) {
				t.Errorf("%v: GET %s without a token: %d, want one of %v\n%s", d, p.HTTPGet.Path, rec.Code, want, rec.Body)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := srv.Close(ctx); err != nil {
			t.Error(err)
		}
		cancel()
		etcd.Close()
	}
}

// authSecret is the example auth file of d's --auth-file.
func authSecret(t *testing.T, s *set, d droverContainer) string {
	t.Helper()
	file := d.flags["auth-file"]
	for _, m := range d.c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Dir(file) {
			continue
		}
		for _, v := range d.w.template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				if sec, ok := s.secrets[v.Secret.SecretName]; ok {
					if body, ok := sec.StringData[filepath.Base(file)]; ok {
						return body
					}
				}
			}
		}
	}
	t.Fatalf("%v: --auth-file %q is no key of an example Secret mounted there (TestServerCluster says more)", d, file)
	return ""
}

// loadAuth loads an auth file's text as drover server --auth-file does.
func loadAuth(t *testing.T, body string) (*httpapi.Auth, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", f, err)
	}
	return httpapi.LoadAuth(f)
}
