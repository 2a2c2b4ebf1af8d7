package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func (a *app) budgetsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "budgets",
		Short: "LLM budgets: requests and tokens per window, shared between tenants",
		Long: `A budget is what a model provider allows one API key: requests and tokens per
window, under a key such as openai/gpt-4.1/key-prod, whose last part names
the API key (never put the API key itself in a budget key: it is stored and
shown in clear). Work reserves an
estimate before each call and settles with the tokens the call used; when
demand exceeds the budget, tenants share it by weight. The configuration
lives in etcd and changes take effect at the next reservation.`,
		Example: `  drover budgets set openai/gpt-4.1/key-prod --tokens 30000 --requests 500 --window 1m --weight acme=1 --weight globex=3
  drover budgets get openai/gpt-4.1/key-prod
  drover budgets list --json`,
	}
	cmd.AddCommand(a.budgetsSetCommand(), a.budgetsGetCommand(), a.budgetsListCommand(), a.budgetsDeleteCommand())
	return cmd
}

// budgetFields are the flags that name a budget's fields in errors.
var budgetFields = map[string]string{"key": "KEY", "requests": "--requests", "tokens": "--tokens", "window_seconds": "--window",
	"caps": "--cap", "weights": "--weight", "estimates": "--estimate"}

func (a *app) budgetsSetCommand() *cobra.Command {
	var requests, tokens int64
	var window time.Duration
	var weights, caps, estimates []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "set KEY [--tokens N] [--requests N] [--window D] [--weight TENANT=W]... [--cap TENANT=N]... [--estimate TASK_TYPE=N]...",
		Short: "Set (or create) a budget, replacing its configuration",
		Long: `Sets the budget's whole configuration: a flag not given takes its default
(no limit; a window of one minute; no caps; weight 1 for every tenant; no
default estimates). The current window's counters and live reservations
stay. --estimate gives a task type's default estimate: a queue task that
names the budget without estimated_tokens reserves its type's.`,
		Example: `  drover budgets set openai/gpt-4.1/key-prod --tokens 30000 --requests 500
  drover budgets set anthropic/claude/key-a --tokens 80000 --window 1m --weight acme=1 --weight globex=3 --cap trial=2000 --json
  drover budgets set openai/gpt-4.1/key-prod --tokens 30000 --estimate summarize=1200 --estimate classify=300`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b := budget.Budget{Key: args[0], Requests: requests, Tokens: tokens}
			if window%time.Second != 0 || window < time.Second {
				return &drover.InputError{Field: "--window", Value: window.String(), Rule: "must be whole seconds, 1s to 24h"}
			}
			b.WindowSeconds = int64(window / time.Second)
			var err error
			if b.Weights, err = tenantValues("--weight", weights, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) }); err != nil {
				return err
			}
			if b.Caps, err = tenantValues("--cap", caps, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }); err != nil {
				return err
			}
			if b.Estimates, err = tenantValues("--estimate", estimates, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }); err != nil {
				return err
			}
			if err := b.Validate(); err != nil {
				return renameBudgetField(err)
			}
			return a.withBudgets(cmd.Context(), func(c *budget.Client) error {
				if _, err := c.Set(cmd.Context(), b); err != nil {
					return err
				}
				u, err := c.Get(cmd.Context(), b.Key)
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(a.stdout).Encode(u)
				}
				fmt.Fprintf(a.stdout, "budget %s set: %s\n", b.Key, limitsOf(b))
				return nil
			})
		},
	}
	cmd.Flags().Int64Var(&tokens, "tokens", 0, "most tokens per window (0: no limit)")
	cmd.Flags().Int64Var(&requests, "requests", 0, "most requests per window (0: no limit)")
	cmd.Flags().DurationVar(&window, "window", time.Minute, "the window, in whole seconds (1s to 24h)")
	cmd.Flags().StringArrayVar(&weights, "weight", nil, "TENANT=W: the tenant's weight when the budget is saturated (repeatable; default 1)")
	cmd.Flags().StringArrayVar(&caps, "cap", nil, "TENANT=N: the most tokens the tenant may take per window (repeatable)")
	cmd.Flags().StringArrayVar(&estimates, "estimate", nil, "TASK_TYPE=N: the tokens a task of that type reserves when it gives no estimated_tokens (repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the budget as JSON")
	return cmd
}

// tenantValues reads TENANT=VALUE (or TASK_TYPE=VALUE) flags.
func tenantValues[T any](flag string, in []string, parse func(string) (T, error)) (map[string]T, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := map[string]T{}
	for _, s := range in {
		i := strings.LastIndex(s, "=")
		if i < 0 {
			return nil, &drover.InputError{Field: flag, Value: s, Rule: "must be NAME=VALUE"}
		}
		v, err := parse(s[i+1:])
		if err != nil {
			return nil, &drover.InputError{Field: flag, Value: s, Rule: "must be NAME=VALUE with a number as VALUE"}
		}
		out[s[:i]] = v
	}
	return out, nil
}

// renameBudgetField names the flag of an InputError's field.
func renameBudgetField(err error) error {
	var in *drover.InputError
	if !errors.As(err, &in) {
		return err
	}
	field, rest, _ := strings.Cut(in.Field, " ")
	if flag, ok := budgetFields[field]; ok {
		return in.Renamed(strings.TrimSpace(flag + " " + rest))
	}
	return err
}

// limitsOf says what b allows.
func limitsOf(b budget.Budget) string {
	var parts []string
	if b.Tokens > 0 {
		parts = append(parts, fmt.Sprintf("%d tokens", b.Tokens))
	}
	if b.Requests > 0 {
		parts = append(parts, fmt.Sprintf("%d requests", b.Requests))
	}
	return strings.Join(parts, " and ") + " per " + (time.Duration(b.WindowSeconds) * time.Second).String()
}

func (a *app) budgetsGetCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "get KEY [--json]",
		Short:   "Show a budget: its limits and the current window's use, per tenant",
		Example: `  drover budgets get openai/gpt-4.1/key-prod --json | jq .remaining`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := budget.CheckKey(args[0]); err != nil {
				return renameBudgetField(err)
			}
			return a.withBudgets(cmd.Context(), func(c *budget.Client) error {
				u, err := c.Get(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(a.stdout).Encode(u)
				}
				return printBudget(a.stdout, u)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the budget as JSON")
	return cmd
}

// printBudget writes u for a person.
func printBudget(w io.Writer, u budget.Usage) error {
	fmt.Fprintf(w, "budget %s: %s\n", u.Key, limitsOf(u.Budget))
	if len(u.Estimates) > 0 {
		var parts []string
		for _, tt := range slices.Sorted(maps.Keys(u.Estimates)) {
			parts = append(parts, fmt.Sprintf("%s=%d", tt, u.Estimates[tt]))
		}
		fmt.Fprintf(w, "default estimates by task type: %s\n", strings.Join(parts, " "))
	}
	remaining := "unlimited"
	if u.Remaining >= 0 {
		remaining = strconv.FormatInt(u.Remaining, 10)
	}
	fmt.Fprintf(w, "window since %s: %d requests, %d tokens used, %d reserved (%d live), %s remaining\n",
		u.WindowStart.Format(time.RFC3339), u.RequestsUsed, u.Used, u.Reserved, u.Live, remaining)
	if len(u.TenantUsage) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tWEIGHT\tCAP\tREQUESTS\tUSED\tRESERVED")
	for _, t := range u.TenantUsage {
		weight, cap := 1.0, "-"
		if v, ok := u.Weights[t.Tenant]; ok {
			weight = v
		}
		if v, ok := u.Caps[t.Tenant]; ok {
			cap = strconv.FormatInt(v, 10)
		}
		name := t.Tenant
		if name == "" {
			name = "(none)"
		}
		fmt.Fprintf(tw, "%s\t%g\t%s\t%d\t%d\t%d\n", name, weight, cap, t.Requests, t.Used, t.Reserved)
	}
	return tw.Flush()
}

func (a *app) budgetsListCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list [--json]",
		Short:   "List budgets with the current window's use",
		Example: `  drover budgets list --json | jq '.[] | select(.remaining == 0) | .key'`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withBudgets(cmd.Context(), func(c *budget.Client) error {
				list, err := c.List(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(a.stdout).Encode(list)
				}
				if len(list) == 0 {
					fmt.Fprintln(a.stdout, "no budgets")
					return nil
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "BUDGET\tWINDOW\tREQUESTS\tTOKENS\tREQUESTS USED\tTOKENS USED")
				for _, u := range list {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\n", u.Key, time.Duration(u.WindowSeconds)*time.Second, u.Requests, u.Tokens, u.RequestsUsed, u.Used)
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func (a *app) budgetsDeleteCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "delete KEY [--json]",
		Short:   "Delete a budget: its configuration, counters and reservations",
		Example: `  drover budgets delete openai/gpt-4.1/key-old --json`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := budget.CheckKey(args[0]); err != nil {
				return renameBudgetField(err)
			}
			return a.withBudgets(cmd.Context(), func(c *budget.Client) error {
				if err := c.Delete(cmd.Context(), args[0]); err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(a.stdout).Encode(map[string]any{"key": args[0], "deleted": true})
				}
				fmt.Fprintf(a.stdout, "budget %s deleted\n", args[0])
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// withBudgets runs f with a budget client of the namespace; a budget that
// is not configured is exit 1, pointing at list.
func (a *app) withBudgets(ctx context.Context, f func(*budget.Client) error) error {
	cli, done, err := a.etcd(ctx)
	if err != nil {
		return err
	}
	defer done()
	c := budget.New(cli, a.namespace)
	defer c.Close()
	if err := f(c); errors.Is(err, budget.ErrNoBudget) {
		return withCode(ExitFailure, fmt.Errorf("%w; see drover budgets list", err))
	} else if err != nil {
		return err
	}
	return nil
}

// registerBudgetMetrics registers the gauges of the namespace's budgets,
// read from etcd at each scrape (budget.Collector), with the registry
// --metrics-listen serves; the returned func unregisters them. A second
// server in one process (tests) leaves the first one's.
func (a *app) registerBudgetMetrics(cli *clientv3.Client) (unregister func()) {
	b := budget.New(cli, a.namespace)
	m := budget.NewCollector(b, budget.CollectorConfig{})
	if err := prometheus.Register(m); err != nil {
		a.logger.Debug("budget metrics not registered", "err", err)
		_ = b.Close()
		return func() {}
	}
	return func() { prometheus.Unregister(m); _ = b.Close() }
}
