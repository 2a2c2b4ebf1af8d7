package cli_test

import (
	"bufio"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
)

type listed struct {
	Component string `json:"component"`
	ID        string `json:"id"`
	Value     struct {
		ID      string          `json:"id"`
		Subject string          `json:"subject"`
		Address string          `json:"address"`
		Data    json.RawMessage `json:"data"`
	} `json:"value"`
	Lease string `json:"lease"`
}

func registryList(t *testing.T, ns string, args ...string) []listed {
	t.Helper()
	r := drover(t, append(append(etcdFlags(ns), "registry", "list", "--json"), args...)...)
	if r.code != 0 {
		t.Fatalf("registry list: exit %d: %s", r.code, r.stderr)
	}
	var out []listed
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("registry list --json: %v in %q", err, r.stdout)
	}
	return out
}

// eventLines reads registry watch --json output as it comes.
type eventLine struct {
	Type      string          `json:"type"`
	Component string          `json:"component"`
	ID        string          `json:"id"`
	Value     json.RawMessage `json:"value"`
	Revision  int64           `json:"revision"`
}

func TestRegistryRegisterListWatch(t *testing.T) {
	ns := etcdtest.Namespace(t)
	watcher := start(t, cleanEnv(), append(etcdFlags(ns), "registry", "watch", "--json")...)
	reg := start(t, cleanEnv(), append(etcdFlags(ns), "registry", "register", "VllmWorker", "--id", "gpu-0",
		"--address", "127.0.0.1:8000", "--data", `{"request_active_slots": 3}`, "--ttl", "2s")...)
	waitFor(t, 20*time.Second, "the registration", func() bool { return strings.Contains(reg.stdout.String(), "registered VllmWorker/gpu-0") })

	list := registryList(t, ns)
	if len(list) != 1 || list[0].Component != "VllmWorker" || list[0].ID != "gpu-0" || list[0].Value.Address != "127.0.0.1:8000" ||
		string(list[0].Value.Data) != `{"request_active_slots":3}` || list[0].Value.Subject != ns+".VllmWorker.gpu-0" {
		t.Fatalf("registry list: %+v", list)
	}
	if got := registryList(t, ns, "other"); len(got) != 0 {
		t.Fatalf("list of another component: %+v", got)
	}

	// A second process cannot take the id.
	dup := drover(t, append(etcdFlags(ns), "registry", "register", "VllmWorker", "--id", "gpu-0", "--address", "127.0.0.1:8001")...)
	if dup.code != 2 || !strings.Contains(dup.stderr, "another live process") {
		t.Fatalf("duplicate registration: exit %d, stderr %s", dup.code, dup.stderr)
	}

	// SIGKILL: the registration was on a 2 s lease, so etcd deletes it and
	// the watcher prints the delete (the wait only guards a hang: when etcd
	// expires a lease on a busy machine is not the registration's doing).
	if ttls := grantedTTLs(t, keyspace.MustNew(ns).Components()); len(ttls) != 1 || ttls[keyspace.MustNew(ns).Endpoint("VllmWorker", "gpu-0")] != 2 {
		t.Fatalf("registration leases %v, want gpu-0 on a 2 s lease", ttls)
	}
	_ = reg.cmd.Process.Signal(syscall.SIGKILL)
	waitFor(t, 60*time.Second, "the delete event", func() bool { return strings.Contains(watcher.stdout.String(), `"type":"delete"`) })
	_ = watcher.cmd.Process.Signal(syscall.SIGTERM)
	if code := watcher.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("watch exit %d after SIGTERM: %s", code, watcher.stderr.String())
	}
	var events []eventLine
	sc := bufio.NewScanner(strings.NewReader(watcher.stdout.String()))
	for sc.Scan() {
		var ev eventLine
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("watch line %q: %v", sc.Text(), err)
		}
		events = append(events, ev)
	}
	if len(events) != 2 || events[0].Type != "put" || events[1].Type != "delete" || events[0].ID != "gpu-0" ||
		events[1].Component != "VllmWorker" || events[1].Revision <= events[0].Revision || !strings.Contains(string(events[0].Value), `"address":"127.0.0.1:8000"`) {
		t.Fatalf("watch events %+v", events)
	}

	// SIGTERM: exit 0 and the endpoint is gone at once (lease revoked).
	reg2 := start(t, cleanEnv(), append(etcdFlags(ns), "registry", "register", "router", "--id", "r1", "--address", "127.0.0.1:9", "--ttl", "30s")...)
	waitFor(t, 20*time.Second, "the registration", func() bool { return strings.Contains(reg2.stdout.String(), "registered router/r1") })
	_ = reg2.cmd.Process.Signal(syscall.SIGTERM)
	if code := reg2.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("register exit %d after SIGTERM: %s", code, reg2.stderr.String())
	}
	if got := registryList(t, ns); len(got) != 0 {
		t.Fatalf("endpoints left after SIGTERM with a 30 s TTL: %+v", got)
	}
}

func TestRegistryBadInput(t *testing.T) {
	ns := etcdtest.Namespace(t)
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"register", "a/b", "--id", "x", "--address", "y"}, "COMPONENT"},
		{[]string{"register", "c", "--id", "bad id", "--address", "y"}, "--id"},
		{[]string{"register", "c", "--address", "y"}, "--id"},
		{[]string{"register", "c", "--id", "x"}, "--address"},
		{[]string{"register", "c", "--id", "x", "--address", "y", "--data", "{not json"}, "--data"},
		{[]string{"register", "c", "--id", "x", "--address", "y", "--data", "[1]"}, "--data"},
		{[]string{"register", "c", "--id", "x", "--address", "y", "--ttl", "100ms"}, "--ttl"},
		{[]string{"register", "c", "--id", "x", "--address", "y", "--ttl", "48h"}, "--ttl"},
		{[]string{"list", "bad/component"}, "COMPONENT"},
		{[]string{"watch", "bad component"}, "COMPONENT"},
	} {
		r := drover(t, append(append(etcdFlags(ns), "registry"), tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.flag) {
			t.Fatalf("registry %v: exit %d, stderr %q; want exit 2 naming %s", tc.args, r.code, r.stderr, tc.flag)
		}
	}
	if got := registryList(t, ns); len(got) != 0 {
		t.Fatalf("bad input registered %+v", got)
	}
}

// TestRegistryRegisterExitsOnLeaseLoss stops etcd under a registered
// process: it must exit 70 by itself, soon after its TTL.
func TestRegistryRegisterExitsOnLeaseLoss(t *testing.T) {
	own, err := etcdtest.Start(etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Stop()
	p := start(t, cleanEnv(), "--etcd-endpoints", strings.Join(own.Endpoints(), ","), "registry", "register", "model", "--id", "m1", "--address", "127.0.0.1:1", "--ttl", "2s")
	waitFor(t, 20*time.Second, "the registration", func() bool { return strings.Contains(p.stdout.String(), "registered model/m1") })
	own.Stop()
	// It gives up when its 2 s lease can no longer have been kept alive;
	// the bound only guards a hang.
	code := p.wait(t, 60*time.Second)
	if code != 70 || !strings.Contains(p.stderr.String(), "lost") {
		t.Fatalf("exit %d after etcd stopped, want 70; stderr:\n%s", code, p.stderr.String())
	}
}

func TestWorkersListsLiveWorkers(t *testing.T) {
	ns := etcdtest.Namespace(t)
	w := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "jobs", "--handler", "exec:sleep 30", "--concurrency", "3", "--worker-id", "w-1", "--ttl", "2s")...)
	var rows []struct {
		ID          string `json:"id"`
		Queue       string `json:"queue"`
		Concurrency int    `json:"concurrency"`
		InFlight    int    `json:"in_flight"`
		PID         int    `json:"pid"`
	}
	read := func() {
		rows = nil
		r := drover(t, append(etcdFlags(ns), "workers", "--json")...)
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rows) != nil {
			t.Fatalf("workers --json: exit %d %q %s", r.code, r.stdout, r.stderr)
		}
	}
	waitFor(t, 20*time.Second, "the worker to register", func() bool { read(); return len(rows) == 1 })
	if rows[0].ID != "w-1" || rows[0].Queue != "jobs" || rows[0].Concurrency != 3 || rows[0].PID != w.cmd.Process.Pid || rows[0].InFlight != 0 {
		t.Fatalf("workers: %+v", rows)
	}
	// Two tasks start: the in-flight count follows within a few seconds.
	for _, id := range []string{"t1", "t2"} {
		if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "jobs", "--type", "slow", "--id", id)...); r.code != 0 {
			t.Fatal(r.stderr)
		}
	}
	waitFor(t, 10*time.Second, "in_flight 2", func() bool { read(); return len(rows) == 1 && rows[0].InFlight == 2 })
	// A second worker with the same id is refused.
	dup := drover(t, append(etcdFlags(ns), "worker", "--queue", "jobs", "--handler", "noop", "--worker-id", "w-1")...)
	if dup.code != 2 || !strings.Contains(dup.stderr, "w-1") {
		t.Fatalf("duplicate worker id: exit %d: %s", dup.code, dup.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "workers", "--queue", "other", "--json")...); strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("workers of another queue: %q", r.stdout)
	}
	// Killed: it drops out within its TTL.
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	waitFor(t, 4*time.Second, "the dead worker to drop out", func() bool { read(); return len(rows) == 0 })
}
