package cli

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/droverhq/drover/budget"
)

// TestReadUsageBounded: a usage report is read through a limit: one of
// maxUsageFile bytes is read, one byte more is refused with an error that
// names the bound, as is one whose tokens are not a number; a missing one
// is fs.ErrNotExist.
func TestReadUsageBounded(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	head := "42\n" + budget.HeaderRemainingTokens + ": 900\n"
	atBound := write("at", head+strings.Repeat(" ", maxUsageFile-len(head)))
	n, h, err := readUsage(atBound)
	if err != nil || n != 42 || h.Get(budget.HeaderRemainingTokens) != "900" {
		t.Fatalf("a report of %d bytes: %d %v %v, want 42 with its header", maxUsageFile, n, h, err)
	}
	_, _, err = readUsage(write("over", head+strings.Repeat(" ", maxUsageFile+1-len(head))))
	if err == nil || !strings.Contains(err.Error(), "larger than 1024 bytes") {
		t.Fatalf("a report of %d bytes: %v, want an error naming the bound", maxUsageFile+1, err)
	}
	// A huge file is not read whole: the limit stops at the bound.
	_, _, err = readUsage(write("huge", strings.Repeat("9", 8<<20)))
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("a report of 8 MiB: %v, want an error naming the bound", err)
	}
	if _, _, err = readUsage(write("nan", "many\n")); err == nil || !strings.Contains(err.Error(), "not a whole number") {
		t.Fatalf("a report whose tokens are not a number: %v", err)
	}
	if _, _, err = readUsage(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no report: %v, want fs.ErrNotExist", err)
	}
}
