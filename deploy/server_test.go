package deploy

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// The etcd members' names and addresses agree with the StatefulSet, its
// headless Service and the ports: --initial-cluster lists drover-0 to
// drover-(replicas-1), each at its pod's DNS name and the peer port; every
// member names and advertises itself with its own pod name; the data dir is
// the persistent volume; the auth file is a key of the Secret mounted there
// and loads; the HTTP API serves the probes' port.
func TestServerCluster(t *testing.T) {
	s := load(t)
	for _, d := range s.command(t, "server") {
		if d.w.sts == nil {
			t.Errorf("%v: drover server members keep their names and data across restarts only in a StatefulSet", d)
			continue
		}
		sts, svc := d.w.sts.Name, d.w.sts.Spec.ServiceName
		if d.w.replicas < 3 || d.w.replicas%2 == 0 {
			t.Errorf("%v: %d replicas; an etcd cluster has an odd number, 3 or more, of members", d, d.w.replicas)
		}
		f := d.flags
		if f["name"] != "$(POD_NAME)" {
			t.Errorf("%v: --name=%q, not $(POD_NAME): each member's name is its pod's", d, f["name"])
		}
		podNameEnv(t, d, "POD_NAME")

		peer := port(t, fmt.Sprintf("%v: --etcd-peer-listen", d), f["etcd-peer-listen"])
		client := port(t, fmt.Sprintf("%v: --etcd-listen", d), f["etcd-listen"])
		if want := namedPort(t, d, "etcd-peer"); peer != want {
			t.Errorf("%v: --etcd-peer-listen port %d, containerPort etcd-peer %d", d, peer, want)
		}
		if want := namedPort(t, d, "etcd-client"); client != want {
			t.Errorf("%v: --etcd-listen port %d, containerPort etcd-client %d", d, client, want)
		}
		var want []string
		for i := range d.w.replicas {
			member := fmt.Sprintf("%s-%d", sts, i)
			want = append(want, fmt.Sprintf("%s=http://%s.%s:%d", member, member, svc, peer))
		}
		if got := strings.Split(f["initial-cluster"], ","); !slices.Equal(got, want) {
			t.Errorf("%v: --initial-cluster=%s\nwant (replicas %d, StatefulSet %s, Service %s, peer port %d):\n  %s",
				d, f["initial-cluster"], d.w.replicas, sts, svc, peer, strings.Join(want, ","))
		}
		if got, want := f["etcd-advertise-peer"], fmt.Sprintf("http://$(POD_NAME).%s:%d", svc, peer); got != want {
			t.Errorf("%v: --etcd-advertise-peer=%s, want %s", d, got, want)
		}
		if got, want := f["etcd-advertise-client"], fmt.Sprintf("http://$(POD_NAME).%s:%d", svc, client); got != want {
			t.Errorf("%v: --etcd-advertise-client=%s, want %s", d, got, want)
		}
		if f["etcd-endpoints"] != "" {
			t.Errorf("%v: --etcd-endpoints makes the server embed no etcd", d)
		}

		checkDataDir(t, d, f["data-dir"])
		checkAuthFile(t, s, d, f["auth-file"])

		http := port(t, fmt.Sprintf("%v: --http-listen", d), f["http-listen"])
		if want := namedPort(t, d, "http"); http != want {
			t.Errorf("%v: --http-listen port %d, containerPort http %d", d, http, want)
		}
		if m, ok := f["metrics-listen"]; ok {
			if got, want := port(t, fmt.Sprintf("%v: --metrics-listen", d), m), namedPort(t, d, "metrics"); got != want {
				t.Errorf("%v: --metrics-listen port %d, containerPort metrics %d", d, got, want)
			}
		}
		checkServerProbes(t, d, http)

		// SIGTERM: the preStop pause, then up to 10 s of HTTP requests
		// finishing, then etcd's stop.
		budget := 10 * time.Second
		if pre := d.c.Lifecycle; pre != nil && pre.PreStop != nil && pre.PreStop.Sleep != nil {
			budget += time.Duration(pre.PreStop.Sleep.Seconds) * time.Second
		}
		checkGrace(t, d, budget+5*time.Second)
	}
}

// checkDataDir: the data dir is a volume from the StatefulSet's claims.
func checkDataDir(t *testing.T, d droverContainer, dir string) {
	t.Helper()
	for _, m := range d.c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Clean(dir) {
			continue
		}
		for _, claim := range d.w.sts.Spec.VolumeClaimTemplates {
			if claim.Name == m.Name {
				return
			}
		}
		t.Errorf("%v: --data-dir %s is volume %s, which is not a volumeClaimTemplate: the member would lose its data with its pod", d, dir, m.Name)
		return
	}
	t.Errorf("%v: --data-dir %s is no volumeMount's mountPath", d, dir)
}

// checkAuthFile: the auth file is a key of a Secret mounted read-only at
// its folder; the example Secret's file is one drover loads.
func checkAuthFile(t *testing.T, s *set, d droverContainer, file string) {
	t.Helper()
	if file == "" {
		t.Errorf("%v: no --auth-file: the HTTP API beyond loopback needs one", d)
		return
	}
	for _, m := range d.c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Dir(file) {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%v: the auth file's volume %s is not mounted readOnly", d, m.Name)
		}
		for _, v := range d.w.template.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.Secret == nil {
				t.Errorf("%v: --auth-file %s is in volume %s, which is not a Secret", d, file, v.Name)
				return
			}
			secret, ok := s.secrets[v.Secret.SecretName]
			if !ok {
				t.Errorf("%v: Secret %s (the auth file's) has no example in k8s/", d, v.Secret.SecretName)
				return
			}
			body, ok := secret.StringData[filepath.Base(file)]
			if !ok {
				t.Errorf("%v: Secret %s has no key %s for --auth-file %s", d, secret.Name, filepath.Base(file), file)
				return
			}
			if _, err := loadAuth(t, body); err != nil {
				t.Errorf("Secret %s: %s does not load: %v", secret.Name, filepath.Base(file), err)
			}
			return
		}
		t.Errorf("%v: no volume %s", d, m.Name)
		return
	}
	t.Errorf("%v: --auth-file %s is in no mounted folder", d, file)
}

// checkServerProbes: startup and liveness ask /healthz, readiness /readyz,
// all on the HTTP API's port; readiness waits longer than /readyz's own 2 s
// check. TestProbesAreServed asks the real routes.
func checkServerProbes(t *testing.T, d droverContainer, http int32) {
	t.Helper()
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"startupProbe", d.c.StartupProbe, "/healthz"},
		{"readinessProbe", d.c.ReadinessProbe, "/readyz"},
		{"livenessProbe", d.c.LivenessProbe, "/healthz"},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%v: no %s with httpGet", d, p.name)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path {
			t.Errorf("%v: %s asks %s, want %s", d, p.name, g.Path, p.path)
		}
		got, err := containerPort(d.w.template.Spec, g.Port)
		if err != nil || got != http {
			t.Errorf("%v: %s port %s is not the HTTP API's port %d (%v)", d, p.name, g.Port.String(), http, err)
		}
		if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
			t.Errorf("%v: %s scheme %s, but the API serves HTTP (no --tls-cert)", d, p.name, g.Scheme)
		}
		if p.path == "/readyz" && p.probe.TimeoutSeconds <= 2 {
			t.Errorf("%v: %s timeoutSeconds %d: /readyz waits up to 2 s for etcd", d, p.name, p.probe.TimeoutSeconds)
		}
	}
}

// checkGrace: the pod's terminationGracePeriodSeconds covers what the
// process does after SIGTERM.
func checkGrace(t *testing.T, d droverContainer, need time.Duration) {
	t.Helper()
	g := d.w.template.Spec.TerminationGracePeriodSeconds
	if g == nil {
		t.Errorf("%v: no terminationGracePeriodSeconds (30 s), but stopping can take %v", d, need)
	} else if time.Duration(*g)*time.Second < need {
		t.Errorf("%v: terminationGracePeriodSeconds %d, but stopping can take %v: SIGKILL would cut it short", d, *g, need)
	}
}

// duration is a duration flag's value, or def when it is not given.
func duration(t *testing.T, d droverContainer, flag string, def time.Duration) time.Duration {
	t.Helper()
	v, ok := d.flags[flag]
	if !ok {
		return def
	}
	x, err := time.ParseDuration(v)
	if err != nil {
		t.Errorf("%v: --%s=%s: %v", d, flag, v, err)
	}
	return x
}

// Workers reach every server member at its DNS name and client port, may
// do so past the network policy, and get the time to drain: SIGTERM lets
// running tasks finish for --shutdown-timeout, stops handlers with --grace
// before SIGKILL, then closes the worker (up to 5 s) and revokes its lease
// (up to 5 s).
func TestWorkers(t *testing.T) {
	s := load(t)
	server := s.command(t, "server")[0]
	var members []string
	for i := range server.w.replicas {
		members = append(members, fmt.Sprintf("%s-%d.%s:%d", server.w.sts.Name, i, server.w.sts.Spec.ServiceName, namedPort(t, server, "etcd-client")))
	}
	for _, d := range s.command(t, "worker") {
		if got := d.flags["etcd-endpoints"]; got != strings.Join(members, ",") {
			t.Errorf("%v: --etcd-endpoints=%s, want every member: %s", d, got, strings.Join(members, ","))
		}
		shutdown := duration(t, d, "shutdown-timeout", 30*time.Second)
		grace := duration(t, d, "grace", 5*time.Second)
		checkGrace(t, d, shutdown+grace+10*time.Second)
		if m, ok := d.flags["metrics-listen"]; ok {
			if got, want := port(t, fmt.Sprintf("%v: --metrics-listen", d), m), namedPort(t, d, "metrics"); got != want {
				t.Errorf("%v: --metrics-listen port %d, containerPort metrics %d", d, got, want)
			}
		}
		for _, p := range s.policies {
			if !selects(t, &p.Spec.PodSelector, server.w.template.Labels) {
				continue
			}
			if !admits(t, p, d.w.template.Labels, server, "etcd-client") {
				t.Errorf("NetworkPolicy %s keeps %v from etcd's client port", p.Name, d)
			}
			if !admits(t, p, server.w.template.Labels, server, "etcd-peer") {
				t.Errorf("NetworkPolicy %s keeps the members from each other's peer port", p.Name)
			}
		}
	}
}

// admits reports whether network policy p lets pods labelled from reach the
// named port of the server pods, in the same namespace.
func admits(t *testing.T, p *networkingv1.NetworkPolicy, from map[string]string, server droverContainer, portName string) bool {
	t.Helper()
	want := namedPort(t, server, portName)
	for _, rule := range p.Spec.Ingress {
		portOK := len(rule.Ports) == 0
		for _, rp := range rule.Ports {
			if rp.Port == nil {
				portOK = true
			} else if n, err := containerPort(server.w.template.Spec, *rp.Port); err == nil && n == want {
				portOK = true
			}
		}
		peerOK := len(rule.From) == 0
		for _, peer := range rule.From {
			if peer.PodSelector != nil && peer.NamespaceSelector == nil && peer.IPBlock == nil && selects(t, peer.PodSelector, from) {
				peerOK = true
			}
		}
		if portOK && peerOK {
			return true
		}
	}
	return false
}
