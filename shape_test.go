package drover_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The size limits of the house (CONTRIBUTING.md): past them a folder, a
// file or a function has stopped being one concept.
const (
	maxFilesPerFolder = 30  // non-test Go files in one folder
	maxFileLines      = 600 // lines of a Go file, tests included
	maxFuncLines      = 80  // lines of a non-test function, signature to brace
)

// goFiles lists the tracked Go files of the repository, every module of
// it (the benchmark and deploy modules included), tests included.
func goFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "*.go").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	var files []string
	for _, f := range strings.Fields(string(out)) {
		if strings.Contains(f, "node_modules/") {
			continue
		}
		if _, err := os.Stat(f); err == nil { // deleted in the work tree: not there
			files = append(files, f)
		}
	}
	return files
}

// TestShape holds the size limits: no folder over maxFilesPerFolder
// non-test Go files, no Go file over maxFileLines lines, no non-test
// function over maxFuncLines lines.
func TestShape(t *testing.T) {
	files := goFiles(t)
	perDir := map[string]int{}
	fset := token.NewFileSet()
	for _, f := range files {
		test := strings.HasSuffix(f, "_test.go")
		if !test {
			perDir[filepath.Dir(f)]++
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(src, []byte("\n")); n > maxFileLines {
			t.Errorf("%s: %d lines, more than %d: split it by concept", f, n, maxFileLines)
		}
		if test {
			continue
		}
		file, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n > maxFuncLines {
				t.Errorf("%s: func %s: %d lines, more than %d: name its steps", f, fd.Name.Name, n, maxFuncLines)
			}
		}
	}
	for dir, n := range perDir {
		if n > maxFilesPerFolder {
			t.Errorf("%s: %d non-test Go files, more than %d: give a concept a package of its own", dir, n, maxFilesPerFolder)
		}
	}
}

// TestDependencies holds the import rules of docs/architecture.md's
// package map that the compiler does not: a user of the queue, the runner
// or the checkpoints links no lock backend but etcd's, and flow control and
// the registry stand without the queue.
func TestDependencies(t *testing.T) {
	rules := []struct {
		pkgs   []string
		banned []string
		why    string
	}{
		{
			pkgs:   []string{"./queue", "./task", "./checkpoint", "./lock"},
			banned: []string{"github.com/rabbitmq/amqp091-go", "go.etcd.io/bbolt", "github.com/redis/go-redis/v9"},
			why:    "the other lock backends live in lock/redislock and lock/paxoslock",
		},
		{
			pkgs:   []string{"./queue", "./task", "./lock"},
			banned: []string{"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters"},
			why:    "an instrumented library depends on the OpenTelemetry API only; package tracing sets up the SDK",
		},
		{
			pkgs:   []string{"./flow", "./registry"},
			banned: []string{"github.com/droverhq/drover/queue"},
			why:    "flow control and the registry stand without the queue; package fleet joins them",
		},
	}
	for _, r := range rules {
		args := append([]string{"list", "-deps"}, r.pkgs...)
		out, err := exec.Command("go", args...).Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		for _, b := range r.banned {
			for _, dep := range strings.Fields(string(out)) {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%v depend on %s: %s", r.pkgs, dep, r.why)
					break
				}
			}
		}
	}
}
