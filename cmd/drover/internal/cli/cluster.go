package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/spf13/cobra"
)

func (a *app) clusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Show or change the members of drover's etcd cluster",
		Long: `Show or change the members of the etcd cluster that "drover server"
processes form (or of any etcd cluster): "status" asks every member for its
state, "remove" takes one out. A member is added by starting a server with
--join.`,
		Example: `  drover cluster status --etcd-endpoints 127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379
  drover cluster remove s4`,
	}
	cmd.AddCommand(a.clusterStatusCommand(), a.clusterRemoveCommand())
	return cmd
}

// memberView is one member in `cluster status --json`.
type memberView struct {
	Name             string   `json:"name"`
	ID               string   `json:"id"`
	PeerURLs         []string `json:"peer_urls"`
	ClientURLs       []string `json:"client_urls"`
	Learner          bool     `json:"learner"`
	Leader           bool     `json:"leader"`
	RaftTerm         uint64   `json:"raft_term"`
	RaftIndex        uint64   `json:"raft_index"`
	RaftAppliedIndex uint64   `json:"raft_applied_index"`
	Revision         int64    `json:"revision"`
	DBSize           int64    `json:"db_size"`
	DBSizeInUse      int64    `json:"db_size_in_use"`
	Version          string   `json:"version,omitempty"`
	Error            string   `json:"error,omitempty"`
}

// clusterView is `cluster status --json`.
type clusterView struct {
	Leader  string       `json:"leader"`
	Members []memberView `json:"members"`
}

func newClusterView(ms []cluster.MemberStatus) clusterView {
	v := clusterView{Members: make([]memberView, len(ms))}
	for i, m := range ms {
		mv := memberView{Name: m.Name, ID: strconv.FormatUint(m.ID, 16), PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.Learner,
			Leader: m.Leader, RaftTerm: m.RaftTerm, RaftIndex: m.RaftIndex, RaftAppliedIndex: m.RaftAppliedIndex,
			Revision: m.Revision, DBSize: m.DBSize, DBSizeInUse: m.DBSizeInUse, Version: m.Version}
		if mv.PeerURLs == nil {
			mv.PeerURLs = []string{}
		}
		if mv.ClientURLs == nil {
			mv.ClientURLs = []string{}
		}
		if m.Err != nil {
			mv.Error = m.Err.Error()
		}
		if m.Leader {
			v.Leader = m.Name
		}
		v.Members[i] = mv
	}
	return v
}

func (a *app) clusterStatusCommand() *cobra.Command {
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every member: leader, raft term and index, database size",
		Long: `Show every member of the cluster that --etcd-endpoints reaches: its name, id,
peer and client URLs, whether it leads or is a learner, its raft term, raft
index and applied index, its store revision and its database size (and the
part of it in use). Each member is asked at its own client URLs, all at once,
for at most --timeout.

Exit 0 when at least one member answered (a member that did not has its
error in the table), 69 when none did or the member list could not be read.`,
		Example: `  drover cluster status
  drover cluster status --etcd-endpoints 10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return usageError{fmt.Errorf("--timeout %s: must be positive", timeout)}
			}
			cli, closeCli, err := a.etcd(cmd.Context())
			if err != nil {
				return err
			}
			defer closeCli()
			ms, err := cluster.MemberStatuses(cmd.Context(), cli, timeout)
			if err != nil {
				return withCode(ExitUnavailable, err)
			}
			answered := 0
			for _, m := range ms {
				if m.Err == nil {
					answered++
				}
			}
			if err := a.printClusterStatus(ms, asJSON); err != nil {
				return err
			}
			if answered == 0 {
				return withCode(ExitUnavailable, errors.New("no member answered"))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {\"leader\": NAME, \"members\": [...]} as JSON")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for each member's answer")
	return cmd
}

func (a *app) printClusterStatus(ms []cluster.MemberStatus, asJSON bool) error {
	v := newClusterView(ms)
	if asJSON {
		return json.NewEncoder(a.stdout).Encode(v)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tLEADER\tLEARNER\tRAFT TERM\tRAFT INDEX\tAPPLIED\tREVISION\tDB SIZE\tIN USE\tPEER URLS\tCLIENT URLS\tERROR")
	for _, m := range v.Members {
		name := m.Name
		if name == "" {
			name = "(unstarted)"
		}
		if m.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t\t%t\t\t\t\t\t\t\t%s\t%s\t%s\n", name, m.ID, m.Learner,
				strings.Join(m.PeerURLs, ","), strings.Join(m.ClientURLs, ","), m.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%t\t%t\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n", name, m.ID, m.Leader, m.Learner,
			m.RaftTerm, m.RaftIndex, m.RaftAppliedIndex, m.Revision, sizeMiB(m.DBSize), sizeMiB(m.DBSizeInUse),
			strings.Join(m.PeerURLs, ","), strings.Join(m.ClientURLs, ","))
	}
	return tw.Flush()
}

// sizeMiB prints a byte count in MiB with one decimal, or in KiB under
// one MiB.
func sizeMiB(n int64) string {
	if n < 1<<20 {
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
}

func (a *app) clusterRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a member from the cluster",
		Long: `Remove the member NAME (its name, or its id in hex as "drover cluster status"
shows it) from the cluster that --etcd-endpoints reaches, with etcd's member
API. etcd refuses a removal that would leave fewer started members than a
quorum. The removed member's server stops by itself within a few seconds;
its data dir cannot be used again: to bring the machine back, delete the
data dir and start "drover server --join".

Remove a member before replacing a machine that is gone for good: a three-
member cluster with one member gone keeps working, but a second loss stops
it.`,
		Example: `  drover cluster remove s4
  drover cluster remove 8e9e05c52164694d --etcd-endpoints 10.0.0.1:2379`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cli, closeCli, err := a.etcd(cmd.Context())
			if err != nil {
				return err
			}
			defer closeCli()
			m, err := cluster.RemoveMember(cmd.Context(), cli, args[0])
			if errors.Is(err, cluster.ErrNoMember) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "removed member %s (%x)\n", m.Name, m.ID)
			return nil
		},
	}
}
