package httpapi_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// openAPIFile is the committed OpenAPI document; DROVER_UPDATE_OPENAPI=1
// rewrites it from the routes.
var openAPIFile = filepath.Join("..", "docs", "openapi.json")

// TestOpenAPIMatchesRoutes: the committed document is the one the routes
// make, and the one the server serves at /openapi.json; every path and
// method it lists is answered by a route (JSON or a problem, never the
// router's plain-text 404 or a 405).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	a := newAPI(t, nil...)
	doc, err := json.MarshalIndent(a.srv.API().OpenAPI(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	doc = append(doc, '\n')
	if os.Getenv("DROVER_UPDATE_OPENAPI") == "1" {
		if err := os.WriteFile(openAPIFile, doc, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	committed, err := os.ReadFile(openAPIFile)
	if err != nil {
		t.Fatalf("%v: run DROVER_UPDATE_OPENAPI=1 go test ./httpapi -run TestOpenAPIMatchesRoutes", err)
	}
	if !bytes.Equal(committed, doc) {
		t.Fatalf("docs/openapi.json differs from the routes: run DROVER_UPDATE_OPENAPI=1 go test ./httpapi -run TestOpenAPIMatchesRoutes and commit it")
	}
	var served, made any
	if err := json.Unmarshal(a.do("GET", "/openapi.json", nil).want(t, 200).Raw, &served); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal(doc, &made)
	if a, b := canon(served), canon(made); a != b {
		t.Fatal("/openapi.json differs from the routes' document")
	}

	var spec struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(doc, &spec); err != nil {
		t.Fatal(err)
	}
	param := regexp.MustCompile(`\{[^}]+\}`)
	var paths []string
	for p := range spec.Paths {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	n := 0
	for _, p := range paths {
		for method := range spec.Paths[p] {
			if strings.HasPrefix(p, "/v1/registry/") && strings.HasSuffix(p, "/watch") || p == "/v1/agent-server/runs/stops" {
				continue // a stream: checked by its own tests
			}
			url := param.ReplaceAllString(p, "x1")
			r := a.do(strings.ToUpper(method), url, "{}", "Accept: application/json")
			ct := r.Header.Get("Content-Type")
			if r.Status == 405 || (r.Status == 404 && !strings.Contains(ct, "json")) {
				t.Errorf("%s %s (as %s): %d %s: the document lists a route that is not served", strings.ToUpper(method), p, url, r.Status, ct)
			}
			n++
		}
	}
	if n < 10 {
		t.Fatalf("only %d operations in the document", n)
	}
}

func canon(v any) string { b, _ := json.Marshal(v); return string(b) }
