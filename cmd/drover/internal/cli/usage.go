package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/spf13/cobra"
)

// EnvUsageDir names the directory where an exec handler's command
// reports the LLM tokens its task used (drover usage): the worker sets
// it, and reads the report after the command exits.
const EnvUsageDir = "DROVER_USAGE_DIR"

func (a *app) usageCommand() *cobra.Command {
	var tokens int64
	var remaining, reset string
	cmd := &cobra.Command{
		Use:   "usage --tokens N [--remaining-tokens N] [--reset-tokens D]",
		Short: "Report the LLM tokens the task an exec handler runs used, for its budget",
		Long: `Report to the worker running this exec handler the LLM tokens its task
used. A task whose metadata names a budget (and its estimated_tokens) has
its estimate reserved before the command starts; after the command exits,
the worker settles the reservation with the tokens reported here, or the
estimate when nothing was reported. The last report wins. drover worker
--handler 'exec:...' sets DROVER_USAGE_DIR, DROVER_TASK_ID and
DROVER_CLAIM_TOKEN in the command's environment; the report is a file
there, so it needs no connection. A task without a budget ignores it.

--remaining-tokens and --reset-tokens pass on the provider's
x-ratelimit-remaining-tokens and x-ratelimit-reset-tokens response
headers: when the provider says fewer tokens remain than the budget
counts, the settle counts the difference as used until the provider's
reset.`,
		Example: `  drover usage --tokens 950
  drover usage --tokens "$(jq .usage.total_tokens response.json)"
  drover usage --tokens 950 --remaining-tokens 27000 --reset-tokens 6s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("tokens") {
				return usageError{errors.New("--tokens is required: the tokens the task used")}
			}
			h := http.Header{}
			if remaining != "" {
				h.Set(budget.HeaderRemainingTokens, remaining)
			}
			if reset != "" {
				h.Set(budget.HeaderResetTokens, reset)
			}
			if err := budget.CheckProviderHeaders(h); err != nil {
				var in *drover.InputError
				if errors.As(err, &in) && strings.Contains(in.Field, "remaining") {
					return drover.Rename(err, "--remaining-tokens")
				}
				return drover.Rename(err, "--reset-tokens")
			}
			return reportUsage(tokens, h)
		},
	}
	cmd.Flags().Int64Var(&tokens, "tokens", 0, fmt.Sprintf("tokens the task used, 0 to %d", queue.MaxEstimatedTokens))
	cmd.Flags().StringVar(&remaining, "remaining-tokens", "", "the provider's x-ratelimit-remaining-tokens header: tokens it says remain")
	cmd.Flags().StringVar(&reset, "reset-tokens", "", "the provider's x-ratelimit-reset-tokens header: when its count resets (6m0s, 1.5s, 20ms or seconds)")
	return cmd
}

// reportUsage writes tokens (and the provider's headers h) as the usage
// of the task the environment names, for its worker to settle: the
// tokens on the first line, then one "Name: value" line per header.
func reportUsage(tokens int64, h http.Header) error {
	if tokens < 0 || tokens > queue.MaxEstimatedTokens {
		return &drover.InputError{Field: "--tokens", Value: tokens, Rule: fmt.Sprintf("must be between 0 and %d", queue.MaxEstimatedTokens)}
	}
	dir, id, token := getenv(EnvUsageDir), getenv("DROVER_TASK_ID"), getenv("DROVER_CLAIM_TOKEN")
	for _, v := range []struct{ name, val string }{{EnvUsageDir, dir}, {"DROVER_TASK_ID", id}, {"DROVER_CLAIM_TOKEN", token}} {
		if v.val == "" {
			return usageError{fmt.Errorf("$%s is not set: drover usage runs inside an exec handler of drover worker, which sets it", v.name)}
		}
	}
	if keyspace.CheckName("DROVER_TASK_ID", id) != nil {
		return usageError{fmt.Errorf("$DROVER_TASK_ID is %q: not a task id", id)}
	}
	if n, err := strconv.ParseInt(token, 10, 64); err != nil || n < 1 {
		return usageError{fmt.Errorf("$DROVER_CLAIM_TOKEN is %q: not a claim's token", token)}
	}
	// Written aside and renamed: the worker never reads half a report.
	path := usagePath(dir, id, token)
	tmp := path + ".tmp"
	report := strconv.FormatInt(tokens, 10)
	for _, name := range []string{budget.HeaderRemainingTokens, budget.HeaderResetTokens} {
		if v := h.Get(name); v != "" {
			report += "\n" + name + ": " + v
		}
	}
	if err := os.WriteFile(tmp, []byte(report), 0o600); err != nil {
		return fmt.Errorf("drover usage: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("drover usage: %w", err)
	}
	return nil
}

// usagePath is the report of task id's claim token in dir.
func usagePath(dir, id, token string) string {
	return filepath.Join(dir, id+"."+token+".usage")
}

// withUsage wraps an exec handler h so that what its command reported with
// drover usage (in dir) goes to used once it returns. The report is read
// and removed whatever the outcome; one that cannot be read (larger than
// maxUsageFile, or not a number) is logged and ignored: the estimate is
// settled.
func withUsage(h queue.Handler, dir string, used func(t *queue.Task, tokens int64, h http.Header)) queue.Handler {
	return func(ctx context.Context, t *queue.Task) ([]byte, error) {
		path := usagePath(dir, t.ID, strconv.FormatInt(t.Token, 10))
		defer os.Remove(path)
		out, err := h(ctx, t)
		// Only a task with a budget has a reservation to settle (the gate
		// keeps a report until the task's settle).
		if t.Metadata.Budget == "" {
			return out, err
		}
		n, hdr, rerr := readUsage(path)
		switch {
		case rerr == nil:
			used(t, n, hdr)
		case !errors.Is(rerr, fs.ErrNotExist):
			slog.Warn("drover usage: the task's report is ignored; its estimate is settled", "task", t.ID, "budget", t.Metadata.Budget, "err", rerr)
		}
		return out, err
	}
}

// maxUsageFile bounds what is read of a usage report: drover usage writes
// a few dozen bytes.
const maxUsageFile = 1 << 10

// readUsage reads the report at path through an io.LimitReader: an error
// that wraps fs.ErrNotExist when there is none, and one that says so when
// it is larger than maxUsageFile or its tokens are not a number.
func readUsage(path string) (int64, http.Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxUsageFile+1))
	if err != nil {
		return 0, nil, fmt.Errorf("usage report %s: %w", path, err)
	}
	if len(b) > maxUsageFile {
		return 0, nil, fmt.Errorf("usage report %s is larger than %d bytes: not a report of drover usage", path, maxUsageFile)
	}
	n, h, ok := parseUsage(b)
	if !ok {
		return 0, nil, fmt.Errorf("usage report %s: its first line is not a whole number of tokens", path)
	}
	return n, h, nil
}

// parseUsage reads a report of reportUsage: the tokens, and the provider's
// headers (nil: none). ok is false when the tokens are not a number.
func parseUsage(b []byte) (int64, http.Header, bool) {
	if len(b) > maxUsageFile {
		return 0, nil, false
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	n, err := strconv.ParseInt(strings.TrimSpace(lines[0]), 10, 64)
	if err != nil || n < 0 {
		return 0, nil, false
	}
	var h http.Header
	for _, l := range lines[1:] {
		name, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		if h == nil {
			h = http.Header{}
		}
		h.Set(strings.TrimSpace(name), strings.TrimSpace(v))
	}
	return n, h, true
}
