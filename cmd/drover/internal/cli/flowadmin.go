package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/keyspace"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// flowDeleteCommand is "delete NAME [--json]" of limits, quotas and
// breakers: del removes the kind's keys; missing is its error for a name
// that is not configured (exit 1, pointing at list).
func (a *app) flowDeleteCommand(kind string, del func(context.Context, *clientv3.Client, string, string) error, missing error, list string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: fmt.Sprintf("Delete a %s: its configuration and state", kind),
		Long: fmt.Sprintf(`Deletes the %s's configuration and state from etcd. Workers that are
running keep their last setting until they stop; a worker started with the
%s's flag creates it again.`, kind, kind),
		Example: fmt.Sprintf("  drover %ss delete crm-api --json", kind),
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
			if err := del(cmd.Context(), cli, a.namespace, args[0]); err != nil {
				if errors.Is(err, missing) {
					return withCode(ExitFailure, fmt.Errorf("no such %s %s; see %s", kind, args[0], list))
				}
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"name": args[0], "deleted": true})
			}
			fmt.Fprintf(a.stdout, "%s %s deleted\n", kind, args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) breakersSetCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "set NAME ['failures=N;cooldown=D;ratio=R;window=D;min-calls=N']",
		Short: "Set (or create) a breaker's thresholds; workers follow within a second",
		Long: `Changes the thresholds given and keeps the others (a new breaker starts
from failures=5;cooldown=30s). The grammar is that of drover worker
--breaker, without the name and types.`,
		Example: `  drover breakers set crm-api 'failures=3;cooldown=1m'
  drover breakers set crm-api 'ratio=0.5;window=1m;min-calls=20' --json`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := args[0]
			if len(args) == 2 {
				spec += ";" + args[1]
			}
			// Check the grammar before anything is contacted.
			if _, err := flow.ParseBreaker("breaker", spec, flow.DefaultBreaker); err != nil {
				return err
			}
			cli, done, err := a.etcd(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			cfg, err := flow.UpdateBreaker(cmd.Context(), cli, a.namespace, args[0], func(c *flow.BreakerConfig) error {
				bf, err := flow.ParseBreaker("breaker", spec, *c)
				if err != nil {
					return err
				}
				if len(bf.Types) > 0 {
					return usageError{errors.New("types belong to a worker's --breaker, not to the breaker's settings")}
				}
				*c = bf.Config
				return nil
			})
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"name": args[0], "failures": cfg.Failures, "cooldown": cfg.Cooldown.String(),
					"ratio": cfg.Ratio, "window": cfg.Window.String(), "min_calls": cfg.MinCalls})
			}
			fmt.Fprintf(a.stdout, "breaker %s: failures %d, cooldown %s, ratio %g, window %s, min calls %d\n", args[0], cfg.Failures, cfg.Cooldown, cfg.Ratio, cfg.Window, cfg.MinCalls)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the breaker's settings as JSON")
	return cmd
}
