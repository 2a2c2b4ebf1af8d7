package drover_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDocNamesEveryPackage: the package documentation is the map of the
// project, so every public package must be on it.
func TestDocNamesEveryPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "github.com/droverhq/drover" || strings.Contains(pkg, "/internal/") || strings.HasSuffix(pkg, "/internal") {
			continue
		}
		if !strings.Contains(string(doc), "["+pkg+"]") {
			t.Errorf("doc.go does not name package %s", pkg)
		}
	}
}
