// Command k8sschemas writes the JSON schemas that kubeconform checks
// Kubernetes manifests against, made from the OpenAPI document of one
// Kubernetes release, so that the manifests in deploy/k8s are validated
// without kubeconform's default download of its schemas from GitHub.
//
// The document is api/openapi-spec/swagger.json of the k8s.io/kubernetes Go
// module at the release's tag, which `go mod download` fetches through the
// Go module proxy like any other module (about 22 MB, once per module
// cache).
//
//	go run ./cmd/k8sschemas -kubernetes v1.37.2 -out "$HOME/.cache/drover/k8s-schemas"
//	kubeconform -strict -kubernetes-version 1.37.2 -schema-location "$HOME/.cache/drover/k8s-schemas" k8s/
//
// It writes OUT/v1.37.2-standalone-strict/KIND-GROUP-VERSION.json (the
// layout kubeconform looks for under a -schema-location folder): one file
// per kind, group and version, such as statefulset-apps-v1.json or
// service-v1.json, each holding every definition it refers to, so no file
// refers to another. The schemas are strict as kubectl's validation is: an
// object with listed properties takes no others. As Kubernetes itself reads
// them, an IntOrString is a string or an integer, a Quantity a string or a
// number, and apiVersion and kind must name the file's kind.
//
// -swagger FILE converts that document instead of downloading one.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	version := flag.String("kubernetes", "", "Kubernetes release whose schemas to write, such as v1.37.2 (the k8s.io/kubernetes module's version)")
	out := flag.String("out", "", "folder to write VERSION-standalone-strict/ into")
	swagger := flag.String("swagger", "", "OpenAPI v2 document to convert instead of the release's api/openapi-spec/swagger.json")
	flag.Parse()
	if *version == "" || *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: k8sschemas -kubernetes vX.Y.Z -out DIR [-swagger swagger.json]")
		os.Exit(2)
	}
	if err := run(*version, *out, *swagger); err != nil {
		fmt.Fprintln(os.Stderr, "k8sschemas:", err)
		os.Exit(1)
	}
}

func run(version, out, swagger string) error {
	if !strings.HasPrefix(version, "v") {
		version = "v" + version
	}
	if swagger == "" {
		dir, err := downloadKubernetes(version)
		if err != nil {
			return err
		}
		swagger = filepath.Join(dir, "api", "openapi-spec", "swagger.json")
	}
	raw, err := os.ReadFile(swagger)
	if err != nil {
		return fmt.Errorf("read the OpenAPI document: %w", err)
	}
	files, err := convert(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", swagger, err)
	}
	return write(filepath.Join(out, version+"-standalone-strict"), files)
}

// downloadKubernetes fetches the k8s.io/kubernetes module at version into
// the module cache and returns its folder. It runs outside any module, so
// that no go.mod or go.sum is touched.
func downloadKubernetes(version string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@"+version)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(stdout.Bytes(), &m); err != nil || m.Error != "" || runErr != nil {
		msg := m.Error
		if msg == "" {
			msg = strings.TrimSpace(stderr.String())
		}
		return "", fmt.Errorf("go mod download k8s.io/kubernetes@%s: %s (the Go module proxy must be reachable, or pass -swagger)", version, msg)
	}
	return m.Dir, nil
}

// gvk is one entry of a definition's x-kubernetes-group-version-kind.
type gvk struct {
	Group, Version, Kind string
}

// apiVersion is the manifest's apiVersion for g: "v1" for the core group,
// "apps/v1" for the others.
func (g gvk) apiVersion() string {
	if g.Group == "" {
		return g.Version
	}
	return g.Group + "/" + g.Version
}

// fileName is where kubeconform looks for g's schema: the kind, the first
// label of the group (none for the core group) and the version, in lower
// case: statefulset-apps-v1.json, service-v1.json,
// networkpolicy-networking-v1.json.
func (g gvk) fileName() string {
	name := strings.ToLower(g.Kind)
	if g.Group != "" {
		name += "-" + strings.ToLower(strings.SplitN(g.Group, ".", 2)[0])
	}
	return name + "-" + strings.ToLower(g.Version) + ".json"
}

// Definitions Kubernetes reads more loosely than the OpenAPI document says.
var overrides = map[string]map[string]any{
	// Ports, maxUnavailable: 8080 or "http", 1 or "25%".
	"io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}},
	// Resources: "500m", "1Gi", or a plain number, 1 or 0.5.
	"io.k8s.apimachinery.pkg.api.resource.Quantity": {"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}},
}

const refPrefix = "#/definitions/"

// convert turns an OpenAPI v2 document into one schema per kind, keyed by
// file name.
func convert(raw []byte) (map[string][]byte, error) {
	var doc struct {
		Definitions map[string]json.RawMessage `json:"definitions"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("not an OpenAPI v2 document: %w", err)
	}
	if len(doc.Definitions) == 0 {
		return nil, errors.New("no definitions: not an OpenAPI v2 document of Kubernetes")
	}
	defs := make(map[string]map[string]any, len(doc.Definitions))
	for name, r := range doc.Definitions {
		d, err := decode(r)
		if err != nil {
			return nil, fmt.Errorf("definition %s: %w", name, err)
		}
		if o, ok := overrides[name]; ok {
			d = o
		}
		strict(d)
		defs[name] = d
	}
	files := make(map[string][]byte)
	from := make(map[string]string) // file name -> definition, to refuse two for one file
	for _, name := range sortedKeys(defs) {
		kinds, err := kindsOf(doc.Definitions[name])
		if err != nil {
			return nil, fmt.Errorf("definition %s: %w", name, err)
		}
		for _, k := range kinds {
			file := k.fileName()
			if prev, ok := from[file]; ok {
				return nil, fmt.Errorf("definitions %s and %s both make %s", prev, name, file)
			}
			from[file] = name
			schema, err := standalone(defs, name, k)
			if err != nil {
				return nil, err
			}
			b, err := json.MarshalIndent(schema, "", " ")
			if err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			files[file] = append(b, '\n')
		}
	}
	if len(files) == 0 {
		return nil, errors.New("no definition has x-kubernetes-group-version-kind: not an OpenAPI v2 document of Kubernetes")
	}
	return files, nil
}

// decode reads a definition with its numbers kept as written.
func decode(r json.RawMessage) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(r))
	dec.UseNumber()
	var d map[string]any
	if err := dec.Decode(&d); err != nil {
		return nil, err
	}
	return d, nil
}

// kindsOf reads a definition's x-kubernetes-group-version-kind: the kinds
// whose manifests it describes (none for a definition that is only a part
// of others).
func kindsOf(r json.RawMessage) ([]gvk, error) {
	var d struct {
		Kinds []gvk `json:"x-kubernetes-group-version-kind"`
	}
	if err := json.Unmarshal(r, &d); err != nil {
		return nil, err
	}
	return d.Kinds, nil
}

// strict makes every object of s that lists its properties refuse others,
// unless it says what else it takes. It follows the schema's structure
// (properties, items, additionalProperties, allOf, anyOf, oneOf), so a
// property that happens to be named "properties" is not taken for the
// keyword.
func strict(s map[string]any) {
	if props, ok := s["properties"].(map[string]any); ok {
		for _, p := range props {
			if ps, ok := p.(map[string]any); ok {
				strict(ps)
			}
		}
		if _, ok := s["additionalProperties"]; !ok {
			s["additionalProperties"] = false
		}
	}
	for _, k := range []string{"items", "additionalProperties"} {
		if sub, ok := s[k].(map[string]any); ok {
			strict(sub)
		}
	}
	for _, k := range []string{"allOf", "anyOf", "oneOf"} {
		if list, ok := s[k].([]any); ok {
			for _, item := range list {
				if sub, ok := item.(map[string]any); ok {
					strict(sub)
				}
			}
		}
	}
}

// standalone is the schema of kind k, described by definition name: the
// definition itself with apiVersion and kind pinned to k's, and under
// "definitions" every definition it refers to, directly or not.
func standalone(defs map[string]map[string]any, name string, k gvk) (map[string]any, error) {
	root := clone(defs[name]).(map[string]any)
	props, _ := root["properties"].(map[string]any)
	for field, value := range map[string]string{"apiVersion": k.apiVersion(), "kind": k.Kind} {
		// A few kinds, WatchEvent, are never written as manifests and have
		// neither.
		if p, ok := props[field].(map[string]any); ok {
			p["enum"] = []any{value}
		}
	}
	used := make(map[string]bool)
	if err := collectRefs(defs, root, used); err != nil {
		return nil, fmt.Errorf("definition %s: %w", name, err)
	}
	if len(used) > 0 {
		sub := make(map[string]any, len(used))
		for ref := range used {
			sub[ref] = defs[ref]
		}
		root["definitions"] = sub
	}
	root["$schema"] = "http://json-schema.org/draft-04/schema#"
	return root, nil
}

// collectRefs adds to used every definition that v refers to, and those
// they refer to.
func collectRefs(defs map[string]map[string]any, v any, used map[string]bool) error {
	switch v := v.(type) {
	case map[string]any:
		if ref, ok := v["$ref"].(string); ok {
			name, found := strings.CutPrefix(ref, refPrefix)
			if !found {
				return fmt.Errorf("$ref %q is not to a definition of the document", ref)
			}
			d, ok := defs[name]
			if !ok {
				return fmt.Errorf("$ref %q: no such definition", ref)
			}
			if !used[name] {
				used[name] = true
				if err := collectRefs(defs, d, used); err != nil {
					return err
				}
			}
		}
		for _, k := range sortedKeys(v) {
			if err := collectRefs(defs, v[k], used); err != nil {
				return err
			}
		}
	case []any:
		for _, item := range v {
			if err := collectRefs(defs, item, used); err != nil {
				return err
			}
		}
	}
	return nil
}

// clone copies a decoded JSON value deeply.
func clone(v any) any {
	switch v := v.(type) {
	case map[string]any:
		c := make(map[string]any, len(v))
		for k, x := range v {
			c[k] = clone(x)
		}
		return c
	case []any:
		c := make([]any, len(v))
		for i, x := range v {
			c[i] = clone(x)
		}
		return c
	}
	return v
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// write replaces dir with files: they go to a fresh folder beside it, which
// is then renamed, so a reader never sees half of them.
func write(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			return err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	fmt.Printf("k8sschemas: %d schemas in %s\n", len(files), dir)
	return nil
}
