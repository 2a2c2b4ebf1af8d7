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
