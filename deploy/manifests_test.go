package deploy

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// newObject makes the typed object for each apiVersion/kind the manifests
// use; a document of any other kind fails the tests until it is added here.
var newObject = map[string]func() metav1.Object{
	"v1/Service":                         func() metav1.Object { return new(corev1.Service) },
	"v1/Secret":                          func() metav1.Object { return new(corev1.Secret) },
	"apps/v1/StatefulSet":                func() metav1.Object { return new(appsv1.StatefulSet) },
	"apps/v1/Deployment":                 func() metav1.Object { return new(appsv1.Deployment) },
	"policy/v1/PodDisruptionBudget":      func() metav1.Object { return new(policyv1.PodDisruptionBudget) },
	"networking.k8s.io/v1/NetworkPolicy": func() metav1.Object { return new(networkingv1.NetworkPolicy) },
}

// manifest is one document of a file under k8s/.
type manifest struct {
	file string // k8s/drover-server.yaml
	kind string // apiVersion/kind
	obj  metav1.Object
}

func (m manifest) String() string { return fmt.Sprintf("%s: %s %s", m.file, m.kind, m.obj.GetName()) }

// workload is a StatefulSet or a Deployment: the pods it runs.
type workload struct {
	manifest
	replicas int32
	selector *metav1.LabelSelector
	template corev1.PodTemplateSpec
	sts      *appsv1.StatefulSet // nil for a Deployment
}

// set is every object of the manifests, by kind.
type set struct {
	all       []manifest
	workloads []workload
	services  map[string]*corev1.Service
	secrets   map[string]*corev1.Secret
	pdbs      []*policyv1.PodDisruptionBudget
	policies  []*networkingv1.NetworkPolicy
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// load decodes every document of k8s/*.yaml into its Kubernetes type,
// refusing unknown fields and duplicate keys as the API server's strict
// field validation does.
func load(t *testing.T) *set {
	t.Helper()
	files, err := filepath.Glob("k8s/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in k8s/ (%v)", err)
	}
	s := &set{services: map[string]*corev1.Service{}, secrets: map[string]*corev1.Secret{}}
	seen := map[string]string{}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range docSeparator.Split(string(raw), -1) {
			j, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Errorf("%s: document %d: %v", file, i+1, err)
				continue
			}
			if string(j) == "null" { // comments only
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Errorf("%s: document %d: %v", file, i+1, err)
				continue
			}
			kind := tm.APIVersion + "/" + tm.Kind
			mk, ok := newObject[kind]
			if !ok {
				t.Errorf("%s: document %d: %s is not a kind these tests know; add it to newObject", file, i+1, kind)
				continue
			}
			obj := mk()
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s: document %d (%s): %v", file, i+1, kind, err)
				continue
			}
			m := manifest{file: file, kind: kind, obj: obj}
			if obj.GetName() == "" {
				t.Errorf("%s: document %d (%s) has no metadata.name", file, i+1, kind)
			}
			if obj.GetNamespace() != "" {
				t.Errorf("%v sets metadata.namespace; the manifests are applied with kubectl -n", m)
			}
			if prev, ok := seen[kind+"/"+obj.GetName()]; ok {
				t.Errorf("%v: the same name is in %s", m, prev)
			}
			seen[kind+"/"+obj.GetName()] = file
			s.all = append(s.all, m)
			switch o := obj.(type) {
			case *corev1.Service:
				s.services[o.Name] = o
			case *corev1.Secret:
				s.secrets[o.Name] = o
			case *appsv1.StatefulSet:
				s.workloads = append(s.workloads, workload{m, replicas(o.Spec.Replicas), o.Spec.Selector, o.Spec.Template, o})
			case *appsv1.Deployment:
				s.workloads = append(s.workloads, workload{m, replicas(o.Spec.Replicas), o.Spec.Selector, o.Spec.Template, nil})
			case *policyv1.PodDisruptionBudget:
				s.pdbs = append(s.pdbs, o)
			case *networkingv1.NetworkPolicy:
				s.policies = append(s.policies, o)
			}
		}
	}
	return s
}

func replicas(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

// selects reports whether sel selects pods labelled l.
func selects(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("selector %v: %v", sel, err)
		return false
	}
	return !s.Empty() && s.Matches(labels.Set(l))
}

// selected is the workloads whose pods sel selects.
func (s *set) selected(t *testing.T, sel *metav1.LabelSelector) []workload {
	t.Helper()
	var out []workload
	for _, w := range s.workloads {
		if selects(t, sel, w.template.Labels) {
			out = append(out, w)
		}
	}
	return out
}

// Every document decodes into its Kubernetes type with no unknown field
// (load fails the test otherwise), and the objects docs/deploy.md describes
// are all there.
func TestManifestsDecodeStrictly(t *testing.T) {
	s := load(t)
	want := []string{
		"v1/Service drover", "v1/Service drover-client", "apps/v1/StatefulSet drover",
		"policy/v1/PodDisruptionBudget drover", "v1/Secret drover-auth",
		"apps/v1/Deployment drover-worker", "policy/v1/PodDisruptionBudget drover-worker",
		"networking.k8s.io/v1/NetworkPolicy drover-server",
	}
	var have []string
	for _, m := range s.all {
		have = append(have, m.kind+" "+m.obj.GetName())
	}
	for _, w := range want {
		if !slices.Contains(have, w) {
			t.Errorf("k8s/ has no %s; it has %s", w, strings.Join(have, ", "))
		}
	}
}

// Each workload's selector selects its own pods; each Service, disruption
// budget and network policy selects the pods of exactly one workload (the
// servers' Services must not send traffic to workers); each spread
// constraint counts the workload's own pods.
func TestSelectors(t *testing.T) {
	s := load(t)
	for _, w := range s.workloads {
		if !selects(t, w.selector, w.template.Labels) {
			t.Errorf("%v: spec.selector %v does not select the template's labels %v", w, w.selector.MatchLabels, w.template.Labels)
		}
		for _, c := range w.template.Spec.TopologySpreadConstraints {
			if !selects(t, c.LabelSelector, w.template.Labels) {
				t.Errorf("%v: topologySpreadConstraints on %s: labelSelector %v does not select the template's labels", w, c.TopologyKey, c.LabelSelector)
			}
		}
	}
	one := func(what string, sel *metav1.LabelSelector) []workload {
		ws := s.selected(t, sel)
		if len(ws) != 1 {
			var names []string
			for _, w := range ws {
				names = append(names, w.String())
			}
			t.Errorf("%s: selector %v selects the pods of %d workloads, not 1: %v", what, sel, len(ws), names)
		}
		return ws
	}
	for _, svc := range s.services {
		one("Service "+svc.Name, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector})
	}
	for _, p := range s.pdbs {
		for _, w := range one("PodDisruptionBudget "+p.Name, p.Spec.Selector) {
			checkBudget(t, p, w)
		}
	}
	for _, p := range s.policies {
		for _, w := range one("NetworkPolicy "+p.Name, &p.Spec.PodSelector) {
			for _, rule := range p.Spec.Ingress {
				for _, port := range rule.Ports {
					if port.Port != nil {
						if _, err := containerPort(w.template.Spec, *port.Port); err != nil {
							t.Errorf("NetworkPolicy %s: %v", p.Name, err)
						}
					}
				}
			}
		}
	}
	// Every workload has a disruption budget.
	for _, w := range s.workloads {
		found := false
		for _, p := range s.pdbs {
			found = found || selects(t, p.Spec.Selector, w.template.Labels)
		}
		if !found {
			t.Errorf("%v has no PodDisruptionBudget", w)
		}
	}
}

// checkBudget: a budget gives maxUnavailable; over a StatefulSet (a
// consensus group) it keeps a majority of the members up.
func checkBudget(t *testing.T, p *policyv1.PodDisruptionBudget, w workload) {
	t.Helper()
	if p.Spec.MaxUnavailable == nil || p.Spec.MinAvailable != nil {
		t.Errorf("PodDisruptionBudget %s: give maxUnavailable (and not minAvailable), which follows scaling", p.Name)
		return
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(p.Spec.MaxUnavailable, int(w.replicas), true)
	if err != nil || n < 1 {
		t.Errorf("PodDisruptionBudget %s: maxUnavailable %s lets no pod go (%v): node drains would never finish", p.Name, p.Spec.MaxUnavailable, err)
	}
	if w.sts != nil && int32(n) > (w.replicas-1)/2 {
		t.Errorf("PodDisruptionBudget %s: maxUnavailable %s of %d members can take the quorum away; at most %d", p.Name, p.Spec.MaxUnavailable, w.replicas, (w.replicas-1)/2)
	}
}

// containerPort resolves a port, by name or number, to a port one of the
// pod's containers declares.
func containerPort(pod corev1.PodSpec, p intstr.IntOrString) (int32, error) {
	for _, c := range pod.Containers {
		for _, cp := range c.Ports {
			if p.Type == intstr.String && cp.Name == p.StrVal || p.Type == intstr.Int && cp.ContainerPort == p.IntVal {
				return cp.ContainerPort, nil
			}
		}
	}
	return 0, fmt.Errorf("port %s is not a containerPort of the pods", p.String())
}

// Every Service port reaches a port the pods declare; a StatefulSet's
// serviceName is a headless Service over its pods, which publishes them
// before they are ready when they start in parallel (peers must resolve
// each other to become ready at all).
func TestServicePorts(t *testing.T) {
	s := load(t)
	for _, svc := range s.services {
		for _, w := range s.selected(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}) {
			for _, p := range svc.Spec.Ports {
				target := p.TargetPort
				if target.Type == intstr.Int && target.IntVal == 0 {
					target = intstr.FromInt32(p.Port)
				}
				if _, err := containerPort(w.template.Spec, target); err != nil {
					t.Errorf("Service %s port %s (%d): %v of %v", svc.Name, p.Name, p.Port, err, w)
				}
			}
		}
	}
	for _, w := range s.workloads {
		if w.sts == nil {
			continue
		}
		svc, ok := s.services[w.sts.Spec.ServiceName]
		if !ok {
			t.Errorf("%v: serviceName %q is not a Service in k8s/", w, w.sts.Spec.ServiceName)
			continue
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("%v: Service %s is not headless (clusterIP: None): pods get no DNS names of their own", w, svc.Name)
		}
		if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, w.template.Labels) {
			t.Errorf("%v: Service %s does not select its pods", w, svc.Name)
		}
		if w.sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
			t.Errorf("%v: podManagementPolicy %q: members wait for a quorum before they are ready, so they must start in parallel", w, w.sts.Spec.PodManagementPolicy)
		}
		if !svc.Spec.PublishNotReadyAddresses {
			t.Errorf("%v: Service %s does not publishNotReadyAddresses: members cannot resolve each other before they are ready, and are never ready", w, svc.Name)
		}
	}
}

// Every container runs as a non-root user on a read-only root file system
// with no capabilities, asks for resources and has a memory limit, and every
// pod says how long it may take to stop.
func TestPodSecurityAndResources(t *testing.T) {
	s := load(t)
	for _, w := range s.workloads {
		pod := w.template.Spec
		if pod.TerminationGracePeriodSeconds == nil {
			t.Errorf("%v: no terminationGracePeriodSeconds", w)
		}
		podNonRoot := pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot
		for _, c := range pod.Containers {
			where := fmt.Sprintf("%v container %s", w, c.Name)
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s: no securityContext", where)
				continue
			}
			if !podNonRoot && (sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot) {
				t.Errorf("%s: runAsNonRoot is not set", where)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: readOnlyRootFilesystem is not true", where)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: allowPrivilegeEscalation is not false", where)
			}
			if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
				t.Errorf("%s: capabilities must drop ALL and add none", where)
			}
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if _, ok := c.Resources.Requests[r]; !ok {
					t.Errorf("%s: no %s request", where, r)
				}
			}
			if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
				t.Errorf("%s: no memory limit", where)
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil {
					if _, ok := c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits."))]; strings.HasPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits.") && !ok {
						t.Errorf("%s: $%s comes from %s, which is not set", where, e.Name, e.ValueFrom.ResourceFieldRef.Resource)
					}
				}
			}
		}
	}
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// Every $(VAR) in a container's args names a variable of its env: Kubernetes
// leaves an unknown one as it is, silently.
func TestArgsReferToDefinedEnv(t *testing.T) {
	s := load(t)
	for _, w := range s.workloads {
		for _, c := range w.template.Spec.Containers {
			defined := map[string]bool{}
			for _, e := range c.Env {
				defined[e.Name] = true
			}
			for _, a := range append(slices.Clone(c.Command), c.Args...) {
				for _, m := range envRef.FindAllStringSubmatch(a, -1) {
					if !defined[m[1]] {
						t.Errorf("%v container %s: %q refers to $(%s), which its env does not define", w, c.Name, a, m[1])
					}
				}
			}
		}
	}
}

// droverArgs splits a drover container's args into the command's words
// (server; paxos serve) and its flags. The manifests write every flag as
// --name=value (or --name for a boolean), so that the flags read the same
// whatever their types; each flag is given once.
func droverArgs(c corev1.Container) (path []string, flags map[string]string, err error) {
	flags = map[string]string{}
	for i, a := range c.Args {
		if !strings.HasPrefix(a, "-") {
			if len(flags) > 0 {
				return nil, nil, fmt.Errorf("argument %d, %q, comes after flags: write flags as --name=value", i, a)
			}
			path = append(path, a)
			continue
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || name == "" {
			return nil, nil, fmt.Errorf("argument %d, %q: write flags as --name=value", i, a)
		}
		if !ok {
			value = "true"
		}
		if _, dup := flags[name]; dup {
			return nil, nil, fmt.Errorf("--%s is given twice", name)
		}
		flags[name] = value
	}
	if len(path) == 0 {
		return nil, nil, fmt.Errorf("args %q name no drover command", c.Args)
	}
	return path, flags, nil
}

// runsDrover reports whether c runs the drover binary: drover's image's
// entrypoint, or drover from another image's PATH.
func runsDrover(c corev1.Container) bool {
	return len(c.Command) == 0 || slices.Equal(c.Command, []string{"drover"}) || slices.Equal(c.Command, []string{"/usr/local/bin/drover"})
}

// droverContainer is a container of a workload running one drover command.
type droverContainer struct {
	w     workload
	c     corev1.Container
	path  []string
	flags map[string]string
}

func (d droverContainer) String() string {
	return fmt.Sprintf("%v container %s (drover %s)", d.w, d.c.Name, strings.Join(d.path, " "))
}

// droverContainers is every container of the manifests, with its command
// and flags; all of them run drover.
func (s *set) droverContainers(t *testing.T) []droverContainer {
	t.Helper()
	var out []droverContainer
	for _, w := range s.workloads {
		for _, c := range w.template.Spec.Containers {
			if !runsDrover(c) {
				t.Errorf("%v container %s: command %q is not drover", w, c.Name, c.Command)
				continue
			}
			path, flags, err := droverArgs(c)
			if err != nil {
				t.Errorf("%v container %s: %v", w, c.Name, err)
				continue
			}
			out = append(out, droverContainer{w, c, path, flags})
		}
	}
	return out
}

// command is the containers running `drover WORDS...`.
func (s *set) command(t *testing.T, words ...string) []droverContainer {
	t.Helper()
	var out []droverContainer
	for _, d := range s.droverContainers(t) {
		if slices.Equal(d.path, words) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no container in k8s/ runs drover %s", strings.Join(words, " "))
	}
	return out
}

// port is the port of a host:port or a URL's host; where names the flag.
func port(t *testing.T, where, hostport string) int32 {
	t.Helper()
	if u, err := url.Parse(hostport); err == nil && u.Host != "" {
		hostport = u.Host
	}
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Errorf("%s: %q is not host:port", where, hostport)
		return 0
	}
	n, err := strconv.ParseInt(p, 10, 32)
	if err != nil {
		t.Errorf("%s: %q: port %q is not a number", where, hostport, p)
	}
	return int32(n)
}

// namedPort is the containerPort called name in c.
func namedPort(t *testing.T, d droverContainer, name string) int32 {
	t.Helper()
	for _, p := range d.c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Errorf("%v: no containerPort named %s", d, name)
	return 0
}

// podNameEnv checks that $(name) is the pod's own name.
func podNameEnv(t *testing.T, d droverContainer, name string) {
	t.Helper()
	for _, e := range d.c.Env {
		if e.Name == name {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("%v: $%s is not the pod's name (valueFrom.fieldRef.fieldPath: metadata.name)", d, name)
			}
			return
		}
	}
	t.Errorf("%v: no $%s in env", d, name)
}

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

// Every file under k8s/ is one these tests read, and every document one
// they decode: a new file is linted as soon as it is added.
func TestEveryFileIsRead(t *testing.T) {
	s := load(t)
	files, _ := filepath.Glob("k8s/*")
	read := map[string]bool{}
	for _, m := range s.all {
		read[m.file] = true
	}
	var missed []string
	for _, f := range files {
		if !read[f] {
			missed = append(missed, f)
		}
	}
	sort.Strings(missed)
	if len(missed) > 0 {
		t.Errorf("files under k8s/ with no Kubernetes object these tests read (name them .yaml): %v", missed)
	}
}
