package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"testing"
)

// swagger is a small OpenAPI v2 document in the shape of Kubernetes' own.
const swagger = `{
 "swagger": "2.0",
 "definitions": {
  "io.k8s.api.apps.v1.Thing": {
   "type": "object",
   "x-kubernetes-group-version-kind": [{"group": "apps", "kind": "Thing", "version": "v1"}],
   "properties": {
    "apiVersion": {"type": "string"},
    "kind": {"type": "string"},
    "metadata": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
    "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.ThingSpec", "description": "the spec"}
   }
  },
  "io.k8s.api.apps.v1.ThingSpec": {
   "type": "object",
   "required": ["replicas"],
   "properties": {
    "replicas": {"type": "integer", "format": "int32"},
    "port": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"},
    "memory": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"},
    "properties": {"type": "object", "additionalProperties": {"type": "object", "properties": {"a": {"type": "string"}}}},
    "items": {"type": "array", "items": {"type": "object", "properties": {"b": {"type": "string"}}}}
   }
  },
  "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object", "properties": {"name": {"type": "string"}}},
  "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
  "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
  "io.k8s.api.core.v1.Widget": {
   "type": "object",
   "x-kubernetes-group-version-kind": [{"group": "", "kind": "Widget", "version": "v1"}],
   "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}}
  },
  "io.k8s.api.networking.v1.Gizmo": {
   "type": "object",
   "x-kubernetes-group-version-kind": [{"group": "networking.k8s.io", "kind": "Gizmo", "version": "v1"}],
   "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}}
  },
  "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent": {
   "type": "object",
   "x-kubernetes-group-version-kind": [{"group": "", "kind": "WatchEvent", "version": "v1"}],
   "properties": {"type": {"type": "string"}}
  }
 }
}`

func convertTest(t *testing.T) map[string]map[string]any {
	t.Helper()
	files, err := convert([]byte(swagger))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for name, b := range files {
		var s map[string]any
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = s
	}
	return out
}

// get walks s along keys.
func get(t *testing.T, s any, keys ...string) any {
	t.Helper()
	for _, k := range keys {
		m, ok := s.(map[string]any)
		if !ok {
			t.Fatalf("at %q of %v: not an object", k, keys)
		}
		s = m[k]
	}
	return s
}

// One file per kind, named as kubeconform looks it up.
func TestFileNames(t *testing.T) {
	files := convertTest(t)
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	want := []string{"gizmo-networking-v1.json", "thing-apps-v1.json", "watchevent-v1.json", "widget-v1.json"}
	if !slices.Equal(names, want) {
		t.Errorf("files %v, want %v", names, want)
	}
}

// A kind's file holds the definitions it refers to, directly or not, and no
// others; apiVersion and kind are pinned.
func TestStandalone(t *testing.T) {
	thing := convertTest(t)["thing-apps-v1.json"]
	var defs []string
	for n := range get(t, thing, "definitions").(map[string]any) {
		defs = append(defs, n)
	}
	sort.Strings(defs)
	want := []string{
		"io.k8s.api.apps.v1.ThingSpec",
		"io.k8s.apimachinery.pkg.api.resource.Quantity",
		"io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
		"io.k8s.apimachinery.pkg.util.intstr.IntOrString",
	}
	if !slices.Equal(defs, want) {
		t.Errorf("definitions %v, want %v", defs, want)
	}
	if got := get(t, thing, "properties", "apiVersion", "enum"); !reflect.DeepEqual(got, []any{"apps/v1"}) {
		t.Errorf("apiVersion enum %v", got)
	}
	if got := get(t, thing, "properties", "kind", "enum"); !reflect.DeepEqual(got, []any{"Thing"}) {
		t.Errorf("kind enum %v", got)
	}
	widget := convertTest(t)["widget-v1.json"]
	if got := get(t, widget, "properties", "apiVersion", "enum"); !reflect.DeepEqual(got, []any{"v1"}) {
		t.Errorf("core apiVersion enum %v", got)
	}
	if _, ok := widget["definitions"]; ok {
		t.Error("widget-v1.json has definitions though it refers to none")
	}
}

// Objects with listed properties take no others, found through the
// schema's structure only (a property named "properties" is a property);
// IntOrString and Quantity read as Kubernetes reads them.
func TestStrict(t *testing.T) {
	thing := convertTest(t)["thing-apps-v1.json"]
	spec := get(t, thing, "definitions", "io.k8s.api.apps.v1.ThingSpec")
	for _, c := range []struct {
		name string
		got  any
	}{
		{"the root", get(t, thing, "additionalProperties")},
		{"a definition", get(t, spec, "additionalProperties")},
		{"a map's values", get(t, spec, "properties", "properties", "additionalProperties", "additionalProperties")},
		{"an array's items", get(t, spec, "properties", "items", "items", "additionalProperties")},
	} {
		if c.got != false {
			t.Errorf("%s: additionalProperties %v, want false", c.name, c.got)
		}
	}
	if m, ok := get(t, spec, "properties", "properties", "additionalProperties").(map[string]any); !ok || m["type"] != "object" {
		t.Errorf("the map named properties lost its values' schema: %v", m)
	}
	ios := get(t, thing, "definitions", "io.k8s.apimachinery.pkg.util.intstr.IntOrString", "oneOf")
	if !reflect.DeepEqual(ios, []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}) {
		t.Errorf("IntOrString oneOf %v", ios)
	}
	q := get(t, thing, "definitions", "io.k8s.apimachinery.pkg.api.resource.Quantity", "oneOf")
	if !reflect.DeepEqual(q, []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}) {
		t.Errorf("Quantity oneOf %v", q)
	}
}

// run writes the release's folder, replacing what was there.
func TestRunWritesTheFolder(t *testing.T) {
	dir := t.TempDir()
	doc := filepath.Join(dir, "swagger.json")
	if err := os.WriteFile(doc, []byte(swagger), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "schemas")
	stale := filepath.Join(out, "v1.2.3-standalone-strict", "stale.json")
	if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run("1.2.3", out, doc); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(out, "v1.2.3-standalone-strict"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 4 || slices.Contains(names, "stale.json") {
		t.Errorf("files %v, want the 4 kinds' and no stale one", names)
	}
	if left, _ := filepath.Glob(filepath.Join(out, "*.tmp-*")); len(left) > 0 {
		t.Errorf("temporary folders left: %v", left)
	}
}

// A document that is not Kubernetes' is refused.
func TestNotKubernetes(t *testing.T) {
	for _, doc := range []string{`{}`, `{"definitions": {"a": {"type": "object"}}}`, `[`} {
		if _, err := convert([]byte(doc)); err == nil {
			t.Errorf("convert(%s): no error", doc)
		}
	}
}
