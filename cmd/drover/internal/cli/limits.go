package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/keyspace"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func (a *app) limitsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limits",
		Short: "Fleet-wide rate limits: set, list and delete",
		Long: `Rate limits are shared by every worker that names them (drover worker --limit
NAME=RATE). Their configuration lives in etcd: a change reaches every worker
within a second, with no restart.`,
		Example: `  drover limits set openai 500/m --burst 50
  drover limits list --json`,
	}
	cmd.AddCommand(a.limitsSetCommand(), a.limitsListCommand(), a.flowDeleteCommand("limit", flow.DeleteLimit, flow.ErrNoLimit, "drover limits list"))
	return cmd
}

func (a *app) limitsSetCommand() *cobra.Command {
	var burst int64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "set NAME RATE [--burst N]",
		Short: "Set (or create) a rate limit; workers follow within a second",
		Example: `  drover limits set openai 500/m
  drover limits set crm-api 20/s --burst 5`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := keyspace.CheckName("NAME", args[0]); err != nil {
				return err
			}
			r, err := flow.ParseRate("RATE", args[1])
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("burst") {
				if err := flow.CheckBurst("--burst", burst); err != nil {
					return err
				}
				r.Burst = burst
			}
			cli, done, err := a.etcd(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := flow.SetRate(cmd.Context(), cli, a.namespace, args[0], r); err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"name": args[0], "rate": r.String(), "per_second": r.PerSecond(), "burst": r.Burst})
			}
			fmt.Fprintf(a.stdout, "limit %s set to %s (burst %d)\n", args[0], r, r.Burst)
			return nil
		},
	}
	cmd.Flags().Int64Var(&burst, "burst", 0, "most tokens saved up (default one second's worth)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the limit as JSON")
	return cmd
}

func (a *app) limitsListCommand() *cobra.Command {
	return flowList(a, "List rate limits with their current use",
		`  drover limits list --json | jq '.[] | select(.available < 1)'`,
		"no rate limits", "LIMIT\tRATE\tBURST\tAVAILABLE\tUSED", flow.Limits,
		func(r flow.LimitUsage) string {
			return fmt.Sprintf("%s\t%s\t%d\t%.1f\t%d", r.Name, r.Rate, r.Burst, r.Available, r.Used)
		})
}

// flowList is the "list [--json]" command of limits, quotas and breakers:
// the rows fetch reads, as a JSON array with --json, else as a table (or
// none when there are none).
func flowList[T any](a *app, short, example, none, header string,
	fetch func(context.Context, *clientv3.Client, string) ([]T, error), line func(T) string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list [--json]",
		Short:   short,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cli, done, err := a.etcd(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			rows, err := fetch(cmd.Context(), cli, a.namespace)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(rows)
			}
			if len(rows) == 0 {
				fmt.Fprintln(a.stdout, none)
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, header)
			for _, r := range rows {
				fmt.Fprintln(tw, line(r))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

// quotaRule is the rule of quotas set's K.
const quotaRule = "must be an integer between 1 and 100000 (0 with --subject: back to the default)"

func (a *app) quotasCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quotas",
		Short: "Fleet-wide concurrency quotas: set, list and delete",
		Long: `A quota caps how many tasks run at once across the fleet: per tenant (quota
"tenant", from metadata.tenant), per task type (quota "type"), or holding a
named resource (any other name). Workers name them with --quota NAME=K; the
limit lives in etcd and changes reach every worker within a second.`,
		Example: `  drover quotas set tenant 2
  drover quotas list --json`,
	}
	var subject string
	var asJSON bool
	set := &cobra.Command{
		Use:   "set NAME K [--subject S]",
		Short: "Set (or create) a quota's limit, for every subject or one",
		Example: `  drover quotas set tenant 4                   # every tenant: 4 at once
  drover quotas set tenant 2 --subject acme    # acme: 2
  drover quotas set tenant 0 --subject acme    # acme back to the default`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := keyspace.CheckName("NAME", args[0]); err != nil {
				return err
			}
			k, err := strconv.Atoi(args[1])
			if err != nil {
				return &drover.InputError{Field: "K", Value: args[1], Rule: quotaRule}
			}
			if k != 0 || subject == "" {
				if err := flow.CheckQuotaLimit("K", k); err != nil {
					return err
				}
			}
			if strings.Contains(subject, "/") {
				return &drover.InputError{Field: "--subject", Value: subject, Rule: "must not contain '/'"}
			}
			cli, done, err := a.etcd(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := flow.SetQuota(cmd.Context(), cli, a.namespace, args[0], subject, k); err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"name": args[0], "subject": subject, "limit": k})
			}
			if subject != "" {
				fmt.Fprintf(a.stdout, "quota %s for %s set to %d\n", args[0], subject, k)
			} else {
				fmt.Fprintf(a.stdout, "quota %s set to %d\n", args[0], k)
			}
			return nil
		},
	}
	set.SetFlagErrorFunc(negativeArgError("K", quotaRule)) // "quotas set tenant -1"
	set.Flags().StringVar(&subject, "subject", "", "one tenant or task type to give a limit of its own (0 removes it)")
	set.Flags().BoolVar(&asJSON, "json", false, "print the quota's setting as JSON")
	list := flowList(a, "List quotas with the slots held now",
		`  drover quotas list --json | jq '.[] | select(.name == "tenant") | .held'`,
		"no quotas", "QUOTA\tLIMIT\tOWN LIMITS\tHELD", flow.Quotas,
		func(q flow.QuotaUsage) string {
			var held, own []string
			for s, n := range q.Held {
				held = append(held, fmt.Sprintf("%s=%d", s, n))
			}
			for s, n := range q.Subjects {
				own = append(own, fmt.Sprintf("%s=%d", s, n))
			}
			sort.Strings(held)
			sort.Strings(own)
			return fmt.Sprintf("%s\t%d\t%s\t%s", q.Name, q.Limit, strings.Join(own, " "), strings.Join(held, " "))
		})
	cmd.AddCommand(set, list, a.flowDeleteCommand("quota", flow.DeleteQuota, flow.ErrNoQuota, "drover quotas list"))
	return cmd
}

// breakerRow is one breaker as drover breakers list prints it.
type breakerRow struct {
	Name        string    `json:"name"`
	State       string    `json:"state"`
	Consecutive int       `json:"consecutive_failures"`
	Since       time.Time `json:"since"`
	Opened      int64     `json:"opened"`
	Failures    int       `json:"failures_to_open"`
	Cooldown    string    `json:"cooldown"`
}

func breakerRows(ctx context.Context, cli *clientv3.Client, ns string) ([]breakerRow, error) {
	bs, err := flow.Breakers(ctx, cli, ns)
	if err != nil {
		return nil, err
	}
	rows := make([]breakerRow, 0, len(bs))
	for _, b := range bs {
		rows = append(rows, breakerRow{b.Name, b.State, b.Consecutive, b.Since, b.Opened, b.Config.Failures, b.Config.Cooldown.String()})
	}
	return rows, nil
}

func (a *app) breakersCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "breakers",
		Short: "Circuit breakers shared by the fleet: set, list, reset and delete",
		Long: `A breaker guards a downstream resource for every worker that names it
(drover worker --breaker NAME): after N consecutive failures it opens for the
whole fleet, tasks that need the resource are deferred (not failed, not
charged a retry), and after a cool-down one probe task goes through; its
success closes the breaker.`,
		Example: `  drover breakers list --json
  drover breakers set crm-api 'failures=3;cooldown=1m'
  drover breakers reset crm-api
  drover breakers delete crm-api`,
	}
	var resetJSON bool
	list := flowList(a, "List breakers and their state",
		`  drover breakers list --json | jq '.[] | select(.state != "closed")'`,
		"no breakers", "BREAKER\tSTATE\tFAILURES\tOPENS AT\tCOOLDOWN\tTIMES OPENED", breakerRows,
		func(b breakerRow) string {
			return fmt.Sprintf("%s\t%s\t%d\t%d\t%s\t%d", b.Name, b.State, b.Consecutive, b.Failures, b.Cooldown, b.Opened)
		})
	reset := &cobra.Command{
		Use:     "reset NAME",
		Short:   "Close a breaker for the whole fleet",
		Example: `  drover breakers reset crm-api`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := keyspace.CheckName("NAME", args[0]); err != nil {
				return err
			}
			cli, done, err := a.etcd(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if err := flow.ResetBreaker(cmd.Context(), cli, a.namespace, args[0]); err != nil {
				return err
			}
			if resetJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"name": args[0], "state": "closed"})
			}
			fmt.Fprintf(a.stdout, "breaker %s closed\n", args[0])
			return nil
		},
	}
	reset.Flags().BoolVar(&resetJSON, "json", false, "print JSON")
	cmd.AddCommand(list, reset, a.breakersSetCommand(), a.flowDeleteCommand("breaker", flow.DeleteBreaker, flow.ErrNoBreaker, "drover breakers list"))
	return cmd
}
