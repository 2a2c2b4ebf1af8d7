package cli

import (
	"encoding/json"
	"fmt"

	"github.com/droverhq/drover/internal/buildinfo"
	"github.com/spf13/cobra"
)

func (a *app) versionCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print drover's version and commit",
		Example: "  drover version\n  drover version --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			info := buildinfo.Get()
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(info)
			}
			fmt.Fprintf(a.stdout, "drover %s (commit %s, %s)\n", info.Version, info.Commit, info.GoVersion)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
