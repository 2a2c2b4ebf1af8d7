package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// usageScript is an exec handler that reports its task's usage with
// drover usage: 7 tokens for task a (twice: the last report wins), none
// for b, 5 for c, which has no budget.
const usageScript = `case "$DROVER_TASK_ID" in
  a) "$DROVER_BIN" usage --tokens 99 && "$DROVER_BIN" usage --tokens 7 || exit 1 ;;
  c) "$DROVER_BIN" usage --tokens 5 || exit 1 ;;
esac
echo '"ok"'
`

// TestUsageSettlesExecHandlerReport: a worker's exec handler reports the
// tokens its task used with drover usage; the budget gate settles them
// instead of the estimate (the estimate for a task that reported none),
// and a task without a budget ignores its report.
func TestUsageSettlesExecHandlerReport(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx := context.Background()
	const key = "openai/gpt-4.1/key-usage"
	b := budget.New(cli, ns)
	defer b.Close()
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	m := queue.Metadata{Budget: key, EstimatedTokens: 40}
	if _, err := c.Submit(ctx, "llm", []queue.Task{{ID: "a", Type: "llm", Metadata: m}, {ID: "b", Type: "llm", Metadata: m}, {ID: "c", Type: "llm"}}, nil); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "usage.sh")
	if err := os.WriteFile(script, []byte(usageScript), 0o755); err != nil {
		t.Fatal(err)
	}
	r := droverEnv(t, cleanEnv("DROVER_BIN="+droverBin), append(etcdFlags(ns), "worker", "--queue", "llm", "--concurrency", "1", "--drain", "--json",
		"--handler", "exec:sh "+script)...)
	if r.code != 0 || !strings.Contains(r.stdout, `"succeeded":3`) {
		t.Fatalf("worker: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
	u, err := b.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if u.Used != 47 || u.Reserved != 0 || u.RequestsUsed != 2 {
		t.Fatalf("used %d, reserved %d, requests %d; want 7 + 40 settled by two reservations; %s", u.Used, u.Reserved, u.RequestsUsed, r.stderr)
	}
}

// TestUsageRefusesBadInput: drover usage outside an exec handler, or
// with bad tokens, is a usage error naming what is wrong.
func TestUsageRefusesBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := cleanEnv("DROVER_USAGE_DIR="+dir, "DROVER_TASK_ID=a", "DROVER_CLAIM_TOKEN=3")
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{cleanEnv(), []string{"usage", "--tokens", "5"}, "$DROVER_USAGE_DIR is not set"},
		{env, []string{"usage"}, "--tokens is required"},
		{env, []string{"usage", "--tokens=-1"}, "--tokens"},
		{env, []string{"usage", "--tokens", "1000000001"}, "--tokens"},
		{cleanEnv("DROVER_USAGE_DIR="+dir, "DROVER_TASK_ID=a", "DROVER_CLAIM_TOKEN=x"), []string{"usage", "--tokens", "5"}, "DROVER_CLAIM_TOKEN"},
	} {
		r := droverEnv(t, tc.env, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 saying %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("refused reports wrote %d files", len(entries))
	}
	if r := droverEnv(t, env, "usage", "--tokens", "12"); r.code != 0 {
		t.Fatalf("usage: exit %d %s", r.code, r.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a.3.usage")); err != nil || string(b) != "12" {
		t.Fatalf("report %q, %v", b, err)
	}
}

// usageHeadersScript reports task a's usage with the provider's headers:
// 100 tokens, and 200 remaining at the provider until its reset in an hour.
const usageHeadersScript = `"$DROVER_BIN" usage --tokens 100 --remaining-tokens 200 --reset-tokens 1h || exit 1
echo '"ok"'
`

// TestUsageCarriesProviderHeaders: drover usage --remaining-tokens and
// --reset-tokens in an exec handler reach the settle, which lowers the
// budget's remaining tokens to the provider's; bad values exit 2 naming
// the flag, and nothing is written.
func TestUsageCarriesProviderHeaders(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx := context.Background()
	const key = "openai/gpt-4.1/key-headers"
	b := budget.New(cli, ns)
	defer b.Close()
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, "llm", []queue.Task{{ID: "a", Type: "llm", Metadata: queue.Metadata{Budget: key, EstimatedTokens: 40}}}, nil); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "usage.sh")
	if err := os.WriteFile(script, []byte(usageHeadersScript), 0o755); err != nil {
		t.Fatal(err)
	}
	r := droverEnv(t, cleanEnv("DROVER_BIN="+droverBin), append(etcdFlags(ns), "worker", "--queue", "llm", "--concurrency", "1", "--drain", "--json",
		"--handler", "exec:sh "+script)...)
	if r.code != 0 || !strings.Contains(r.stdout, `"succeeded":1`) {
		t.Fatalf("worker: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
	u, err := b.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// drover counted 900 left after the 100 used; the provider said 200.
	if u.Remaining != 200 || u.Used != 800 {
		t.Fatalf("remaining %d, used %d; want the provider's 200 remaining (100 used + 700 corrected); %s", u.Remaining, u.Used, r.stderr)
	}
	dir := t.TempDir()
	env := cleanEnv("DROVER_USAGE_DIR="+dir, "DROVER_TASK_ID=a", "DROVER_CLAIM_TOKEN=3")
	for _, tc := range [][]string{{"--remaining-tokens", "lots"}, {"--remaining-tokens=-1"}, {"--reset-tokens", "soon"}, {"--reset-tokens", "48h"}} {
		r := droverEnv(t, env, append([]string{"usage", "--tokens", "5"}, tc...)...)
		if r.code != 2 || !strings.Contains(r.stderr, strings.SplitN(tc[0], "=", 2)[0]) {
			t.Errorf("usage %v: exit %d, stderr %q; want exit 2 naming the flag", tc, r.code, r.stderr)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("refused reports wrote %d files", len(entries))
	}
}
