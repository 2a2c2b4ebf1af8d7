package cli

import (
	"github.com/droverhq/drover/paxos/client"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/paxos"
	"github.com/spf13/cobra"
)

// Environment read by drover paxos.
const (
	// EnvRabbitMQURL is the default of --transport, as a Kubernetes
	// deployment sets it from a Secret.
	EnvRabbitMQURL = "RABBITMQ_URL"
	// EnvPaxosEndpoints is the default of --endpoints.
	EnvPaxosEndpoints = "PAXOS_ENDPOINTS"
)

func (a *app) paxosCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "paxos",
		Short: "Run and inspect drover's replicated lock service (Multi-Paxos over RabbitMQ or direct TCP)",
		Long: `drover's own lock service, for sites that run RabbitMQ but not etcd: three or
five "drover paxos serve" nodes keep one lock table consistent with
Multi-Paxos, and serve it over a small REST API (POST/GET/DELETE
/locks/{id}, POST /locks/{id}/renew, GET /locks, GET /status). Use it from
drover with --lock-backend paxos://HOST:PORT,HOST:PORT,HOST:PORT.`,
		Example: `  drover paxos serve --id 0 --peers 0=127.0.0.1:7100,1=127.0.0.1:7101,2=127.0.0.1:7102 --transport direct --data-dir /var/lib/paxos-0
  drover paxos status --endpoints 127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102
  drover lock run nightly --lock-backend paxos://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102 -- ./report.sh`,
	}
	cmd.AddCommand(a.paxosServeCommand(), a.paxosStatusCommand(), a.paxosMembersCommand())
	return cmd
}

// paxosServeFlags are the flags of drover paxos serve.
type paxosServeFlags struct {
	id             int64
	peers          string
	transport      string
	listen         string
	dataDir        string
	group          string
	lockDelay      time.Duration
	requestTimeout time.Duration
	join           bool
}

// paxosServeConfig is what the flags say, checked.
type paxosServeConfig struct {
	node       paxos.Config
	amqpURL    *url.URL // nil for the direct transport
	listen     string
	reqTimeout time.Duration
	join       bool
}

func (a *app) paxosServeCommand() *cobra.Command {
	f := paxosServeFlags{id: -1}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run one node of a replicated lock service group",
		Long: `Run one node of a group: proposer, acceptor and learner of the log, and
the REST API on --listen. Nodes reach each other over RabbitMQ (--transport
amqp://..., default $RABBITMQ_URL: one exclusive queue per node on a topic
exchange) or directly (--transport direct: a long-lived connection to each
peer's --listen address, at /paxos/v1/stream).

--id defaults to the ordinal of $HOSTNAME, as a StatefulSet names its pods
(lock-service-2 is node 2). --peers lists every member: "0=HOST:PORT,1=..."
or, for a StatefulSet, "HOST-0.SVC:PORT,HOST-1.SVC:PORT,..." whose first
labels end in the ordinal. Over RabbitMQ the addresses are optional ("0,1,2").
--peers is the initial membership, this node included; a restarted node reads
its members from its data dir, which remembers its group and node id and
refuses to be reused by another. A node that joins a running group takes
--join, lists the current members without itself, and waits until
"drover paxos members add" adds it.

On a new (empty) data dir without --join, the node first asks the other
members (for up to 5 s, until enough have answered) whether the group already
has state. If one has a commit or a promise, this node is a member that lost
its data dir (or a founder started after the group began): it is refused,
since it would vote as if it had promised nothing. Remove it ("drover paxos
members remove"), then start it with --join and add it.

The API has no authentication: listen on a network only trusted clients
reach. Acceptor state is fsynced to --data-dir before any reply.

On SIGTERM or SIGINT it stops in this order: the API stops accepting and
drains the requests in flight (up to --request-timeout), then the node stops
(its log and storage closed), then the transport is closed.

Exit codes: 2 for bad flags, a port in use, a data dir of another group, or
a new data dir for a member of a group that already has state (nothing is
written); 69 if RabbitMQ cannot be reached; 0 after a signal.`,
		Example: `  drover paxos serve --id 0 --peers 0=127.0.0.1:7100,1=127.0.0.1:7101,2=127.0.0.1:7102 --transport direct --data-dir ./paxos-0
  RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5672/ drover paxos serve --id 1 --peers 0,1,2 --listen 127.0.0.1:7101 --data-dir ./paxos-1
  drover paxos serve --join --id 3 --listen 127.0.0.1:7103 --peers 0=127.0.0.1:7100,1=127.0.0.1:7101,2=127.0.0.1:7102 --transport direct --data-dir ./paxos-3
  HOSTNAME=lock-service-2 drover paxos serve --peers lock-service-0.lock-service-headless:3000,lock-service-1.lock-service-headless:3000,lock-service-2.lock-service-headless:3000 --listen 0.0.0.0:3000 --data-dir /data`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.checkGlobal(); err != nil {
				return err
			}
			cfg, err := f.check(cmd)
			if err != nil {
				return err
			}
			return a.paxosServe(cmd.Context(), cfg)
		},
	}
	fl := cmd.Flags()
	fl.Int64Var(&f.id, "id", 0, "this node's id (default: the ordinal of $HOSTNAME, lock-service-2 is 2)")
	fl.StringVar(&f.peers, "peers", "", `every member: "0=HOST:PORT,1=HOST:PORT,2=HOST:PORT", or HOST-N:PORT names ending in their ordinal`)
	fl.StringVar(&f.transport, "transport", "", "amqp://USER:PASS@HOST:5672/ or direct (default $RABBITMQ_URL)")
	fl.StringVar(&f.listen, "listen", "", "host:port of the REST API (and of the direct transport) (default: this node's address in --peers)")
	fl.StringVar(&f.dataDir, "data-dir", "", "directory of this node's durable state (created; required)")
	fl.StringVar(&f.group, "group", "drover", "group name: nodes of different groups never talk, and a data dir belongs to one group")
	fl.DurationVar(&f.lockDelay, "lock-delay", 0, "after a lock expires (not when it is released), how long before it can be granted again")
	fl.DurationVar(&f.requestTimeout, "request-timeout", paxos.DefaultRequestTimeout, "how long a request waits for a quorum before answering 504")
	fl.BoolVar(&f.join, "join", false, "join a running group: --peers lists its current members, without this node, which waits until \"drover paxos members add\" adds it")
	return cmd
}

// check validates every flag before anything touches the disk or the
// network.
func (f *paxosServeFlags) check(cmd *cobra.Command) (paxosServeConfig, error) {
	var cfg paxosServeConfig
	if !groupName.MatchString(f.group) {
		return cfg, &drover.InputError{Field: "--group", Value: f.group, Rule: "must be 1 to 64 letters, digits, '_' or '-' (it is part of RabbitMQ routing keys)"}
	}
	if strings.TrimSpace(f.peers) == "" {
		return cfg, &drover.InputError{Field: "--peers", Rule: `is required: every member, such as 0=127.0.0.1:7100,1=127.0.0.1:7101,2=127.0.0.1:7102`}
	}
	peers, err := parsePeers(f.peers)
	if err != nil {
		return cfg, err
	}
	id, err := f.nodeID(cmd)
	if err != nil {
		return cfg, err
	}
	var self *paxos.Peer
	if i := slices.IndexFunc(peers, func(p paxos.Peer) bool { return p.ID == id }); i >= 0 {
		self = &peers[i]
	}
	switch {
	case self == nil && !f.join:
		return cfg, &drover.InputError{Field: "--id", Value: uint64(id), Rule: "must be one of the members in --peers (or pass --join to join a running group)"}
	case self != nil && f.join:
		return cfg, &drover.InputError{Field: "--peers", Value: f.peers, Rule: fmt.Sprintf("must not list node %d with --join: a joining node lists the current members without itself", id)}
	case self == nil:
		self = &paxos.Peer{ID: id}
	}
	transport := f.transport
	if !cmd.Flags().Changed("transport") {
		transport = strings.TrimSpace(getenv(EnvRabbitMQURL))
	}
	switch {
	case transport == "":
		return cfg, &drover.InputError{Field: "--transport", Rule: "is required: amqp://USER:PASS@HOST:5672/ or direct (or set $" + EnvRabbitMQURL + ")"}
	case transport == "direct":
		for _, p := range peers {
			if p.Addr == "" {
				return cfg, &drover.InputError{Field: "--peers", Value: f.peers, Rule: fmt.Sprintf("member %d has no address: the direct transport dials every member's HOST:PORT", p.ID)}
			}
		}
	default:
		u, err := url.Parse(transport)
		if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
			shown := transport
			if err == nil {
				shown = u.Redacted()
			}
			return cfg, &drover.InputError{Field: "--transport", Value: shown, Rule: "must be direct or an amqp:// or amqps:// URL with a host"}
		}
		cfg.amqpURL = u
	}
	cfg.listen = f.listen
	if cfg.listen == "" {
		if self.Addr == "" {
			return cfg, &drover.InputError{Field: "--listen", Rule: "is required when --peers gives this node no address"}
		}
		cfg.listen = self.Addr
	}
	if err := checkHostPort("--listen", cfg.listen); err != nil {
		return cfg, err
	}
	if strings.TrimSpace(f.dataDir) == "" {
		return cfg, &drover.InputError{Field: "--data-dir", Rule: "is required: the directory of this node's durable state"}
	}
	if err := drover.CheckDuration("--lock-delay", f.lockDelay, 0, time.Hour); err != nil {
		return cfg, err
	}
	if err := drover.CheckDuration("--request-timeout", f.requestTimeout, 100*time.Millisecond, 10*time.Minute); err != nil {
		return cfg, err
	}
	cfg.reqTimeout, cfg.join = f.requestTimeout, f.join
	cfg.node = paxos.Config{ID: id, Group: f.group, Peers: peers, DataDir: f.dataDir, LockDelay: f.lockDelay}
	return cfg, nil
}

// nodeID is --id, or the ordinal of $HOSTNAME.
func (f *paxosServeFlags) nodeID(cmd *cobra.Command) (paxos.NodeID, error) {
	if cmd.Flags().Changed("id") {
		if f.id < 0 {
			return 0, &drover.InputError{Field: "--id", Value: f.id, Rule: "must be 0 or more"}
		}
		return paxos.NodeID(f.id), nil
	}
	host := getenv("HOSTNAME")
	n, ok := ordinal(strings.SplitN(host, ".", 2)[0])
	if !ok {
		return 0, &drover.InputError{Field: "--id", Rule: fmt.Sprintf("is required: $HOSTNAME %q does not end in -N (as lock-service-2 does)", host)}
	}
	return paxos.NodeID(n), nil
}

// groupName is the form of --group: it goes into RabbitMQ routing keys
// ("GROUP.node.ID") and the direct transport's handshake.
var groupName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ordinal reads the N of NAME-N.
func ordinal(name string) (uint64, bool) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseUint(name[i+1:], 10, 32)
	return n, err == nil
}

// checkHostPort checks a host:port flag value.
func checkHostPort(field, hp string) error {
	_, port, err := net.SplitHostPort(hp)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		return &drover.InputError{Field: field, Value: hp, Rule: "must be host:port, such as 127.0.0.1:7100"}
	}
	return nil
}

// parsePeers reads --peers: "N=HOST:PORT", "N" (no address) or
// "HOST-N[.DOMAIN]:PORT" items, comma-separated.
func parsePeers(s string) ([]paxos.Peer, error) {
	bad := func(item, rule string) error {
		return &drover.InputError{Field: "--peers", Value: s, Rule: fmt.Sprintf("member %q %s", item, rule)}
	}
	var peers []paxos.Peer
	seen := map[paxos.NodeID]bool{}
	addrs := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		var p paxos.Peer
		idText, addr, hasID := strings.Cut(item, "=")
		if !hasID && !strings.Contains(item, ":") {
			idText, addr, hasID = item, "", true
		}
		if hasID {
			n, err := strconv.ParseUint(strings.TrimSpace(idText), 10, 32)
			if err != nil {
				return nil, bad(item, "must start with a node id (a number), as in 0=127.0.0.1:7100")
			}
			p = paxos.Peer{ID: paxos.NodeID(n), Addr: strings.TrimSpace(addr)}
		} else {
			host, _, err := net.SplitHostPort(item)
			n, ok := ordinal(strings.SplitN(host, ".", 2)[0])
			if err != nil || !ok {
				return nil, bad(item, "must be ID=HOST:PORT, or HOST:PORT with a host name ending in -N (lock-service-0.svc:3000)")
			}
			p = paxos.Peer{ID: paxos.NodeID(n), Addr: item}
		}
		if p.Addr != "" && checkHostPort("--peers", p.Addr) != nil {
			return nil, bad(item, "has an address that is not host:port")
		}
		if seen[p.ID] {
			return nil, bad(item, fmt.Sprintf("repeats node id %d", p.ID))
		}
		if p.Addr != "" && addrs[p.Addr] {
			return nil, bad(item, "repeats the address of another member")
		}
		seen[p.ID], addrs[p.Addr] = true, p.Addr != ""
		peers = append(peers, p)
	}
	if len(peers) == 0 {
		return nil, &drover.InputError{Field: "--peers", Value: s, Rule: "must list at least one member"}
	}
	sort.Slice(peers, func(i, j int) bool { return peers[i].ID < peers[j].ID })
	return peers, nil
}

// paxosClient makes a client of --endpoints (default $PAXOS_ENDPOINTS,
// else 127.0.0.1:7100).
func paxosClient(endpoints string) (*client.Client, error) {
	for _, e := range []string{getenv(EnvPaxosEndpoints), "127.0.0.1:7100"} {
		if strings.TrimSpace(endpoints) == "" {
			endpoints = e
		}
	}
	eps := strings.FieldsFunc(endpoints, func(r rune) bool { return r == ',' || r == ' ' })
	c, err := client.New(client.Config{Endpoints: eps})
	if err != nil {
		return nil, &drover.InputError{Field: "--endpoints", Value: endpoints, Rule: "must be HOST:PORT of the nodes' APIs, comma-separated: " + err.Error()}
	}
	return c, nil
}

// paxosError gives a client error its exit code: 69 when no node
// answered or there is no quorum, 2 for a refused request.
func paxosError(err error) error {
	switch {
	case errors.Is(err, client.ErrUnreachable):
		return withCode(ExitUnavailable, fmt.Errorf("%w; check --endpoints, and that the nodes run", err))
	case errors.Is(err, paxos.ErrTimeout):
		return withCode(ExitUnavailable, fmt.Errorf("%w; a majority of the group must be up and connected", err))
	case errors.Is(err, client.ErrBadRequest):
		return usageError{err}
	}
	return err
}

// paxosNodeJSON is one node's line of drover paxos status --json.
type paxosNodeJSON struct {
	Endpoint string        `json:"endpoint"`
	ID       *paxos.NodeID `json:"id,omitempty"`
	Role     string        `json:"role,omitempty"`
	Leader   *paxos.NodeID `json:"leader,omitempty"`
	Ballot   string        `json:"ballot,omitempty"`
	Commit   uint64        `json:"commit"`
	Applied  uint64        `json:"applied"`
	// Lag is the leader's commit index minus the highest slot this node
	// acknowledged, as the leader sees it; absent when the leader did not
	// answer.
	Lag   *uint64 `json:"lag,omitempty"`
	Error string  `json:"error,omitempty"`
}

// paxosStatusJSON is what drover paxos status --json prints.
type paxosStatusJSON struct {
	HasLeader  bool            `json:"has_leader"`
	Leader     *paxos.NodeID   `json:"leader,omitempty"`
	LeaderAddr string          `json:"leader_addr,omitempty"`
	Ballot     string          `json:"ballot,omitempty"`
	Commit     uint64          `json:"commit"`
	Nodes      []paxosNodeJSON `json:"nodes"`
	answered   int
}

// paxosSummary puts the nodes' views together: the leader is the node
// that says it leads with the highest ballot, and each node's lag is the
// leader's view of it.
func paxosSummary(all []client.EndpointStatus) paxosStatusJSON {
	var out paxosStatusJSON
	var lead *paxos.NodeStatus
	for i := range all {
		st := &all[i].Status
		if all[i].Err == nil && st.Role == "leader" && (lead == nil || lead.Ballot.Less(st.Ballot)) {
			lead = st
		}
	}
	lags := map[paxos.NodeID]uint64{}
	if lead != nil {
		id := lead.ID
		out.HasLeader, out.Leader, out.LeaderAddr, out.Ballot, out.Commit = true, &id, lead.LeaderAddr, lead.Ballot.String(), lead.Commit
		for _, m := range lead.Members {
			lags[m.ID] = m.Lag
		}
	}
	for _, e := range all {
		n := paxosNodeJSON{Endpoint: e.Endpoint}
		if e.Err != nil {
			n.Error = e.Err.Error()
			out.Nodes = append(out.Nodes, n)
			continue
		}
		out.answered++
		st := e.Status
		id := st.ID
		n.ID, n.Role, n.Ballot, n.Commit, n.Applied = &id, st.Role, st.Ballot.String(), st.Commit, st.Applied
		if st.HasLeader {
			l := st.Leader
			n.Leader = &l
		}
		if lag, ok := lags[st.ID]; ok {
			n.Lag = &lag
		}
		out.Nodes = append(out.Nodes, n)
	}
	return out
}

func (a *app) paxosStatusCommand() *cobra.Command {
	var (
		endpoints string
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the group's leader, ballot and commit index, and each node's lag",
		Long: `Ask every node in --endpoints for its view (GET /status, answered locally,
without a round through the log) and show the leader, its ballot and commit
index, and for each node its role, commit and applied index and its lag
(the leader's commit index minus the highest slot the node acknowledged).

Exit codes: 0 when at least one node answered; 69 when none did.`,
		Example: `  drover paxos status --endpoints 127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102
  PAXOS_ENDPOINTS=lock-service-0.lock-service-headless:3000 drover paxos status --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.checkGlobal(); err != nil {
				return err
			}
			c, err := paxosClient(endpoints)
			if err != nil {
				return err
			}
			defer func() { _ = c.Close(cmd.Context()) }()
			ctx, cancel := context.WithTimeout(cmd.Context(), a.dialTimeout)
			defer cancel()
			sum := paxosSummary(c.StatusAll(ctx))
			if asJSON {
				if err := json.NewEncoder(a.stdout).Encode(sum); err != nil {
					return err
				}
			} else if err := printPaxosStatus(a, sum); err != nil {
				return err
			}
			if sum.answered == 0 {
				return withCode(ExitUnavailable, fmt.Errorf("no node of %s answered; check --endpoints, and that the nodes run", strings.Join(c.Endpoints(), ",")))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&endpoints, "endpoints", "", "the nodes' API addresses, HOST:PORT comma-separated (default $PAXOS_ENDPOINTS, else 127.0.0.1:7100)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printPaxosStatus(a *app, sum paxosStatusJSON) error {
	if sum.HasLeader {
		where := ""
		if sum.LeaderAddr != "" {
			where = " at " + sum.LeaderAddr
		}
		fmt.Fprintf(a.stdout, "leader: node %d%s, ballot %s, commit %d\n", *sum.Leader, where, sum.Ballot, sum.Commit)
	} else {
		fmt.Fprintln(a.stdout, "leader: none of the nodes that answered leads (an election may be under way, or no majority is up)")
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tID\tROLE\tLEADER\tBALLOT\tCOMMIT\tAPPLIED\tLAG")
	for _, n := range sum.Nodes {
		if n.Error != "" {
			fmt.Fprintf(tw, "%s\t-\tunreachable\t-\t-\t-\t-\t-\t(%s)\n", n.Endpoint, n.Error)
			continue
		}
		leader, lag := "none", "?"
		if n.Leader != nil {
			leader = strconv.FormatUint(uint64(*n.Leader), 10)
		}
		if n.Lag != nil {
			lag = strconv.FormatUint(*n.Lag, 10)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%s\n", n.Endpoint, *n.ID, n.Role, leader, n.Ballot, n.Commit, n.Applied, lag)
	}
	return tw.Flush()
}

func (a *app) paxosMembersCommand() *cobra.Command {
	f := &paxosMemberFlags{id: -1}
	cmd := &cobra.Command{
		Use:   "members",
		Short: "Add a node to the group or remove one, through the log",
		Long: `Change the group's membership through the log, one change at a time: the
change is chosen like any command, and takes effect for the slots after it.
Start the new node first (drover paxos serve --join, with its own --id and
the current members in --peers), then add it; it catches up from the others
and votes once the change is applied. A removed node stops voting; stop it
afterwards.

Exit codes: 69 if no node answered or there is no quorum; 2 for bad flags or
a request the group refused as malformed; 1 if it refused the change.`,
		Example: `  drover paxos members add --id 3 --addr 127.0.0.1:7103 --endpoints 127.0.0.1:7100
  drover paxos members remove --id 3 --endpoints 127.0.0.1:7100`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.endpoints, "endpoints", "", "the nodes' API addresses, HOST:PORT comma-separated (default $PAXOS_ENDPOINTS, else 127.0.0.1:7100)")
	pf.DurationVar(&f.timeout, "timeout", 30*time.Second, "how long to wait for the change to be chosen")
	pf.Int64Var(&f.id, "id", 0, "the node's id (required)")
	add := &cobra.Command{
		Use:     "add --id N [--addr HOST:PORT]",
		Short:   "Add node N (its API and direct transport at --addr) to the group",
		Example: `  drover paxos members add --id 3 --addr 127.0.0.1:7103 --endpoints 127.0.0.1:7100,127.0.0.1:7101`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.paxosChange(cmd, f, "added to", func(ctx context.Context, c *client.Client) error {
				return c.AddNode(ctx, paxos.Peer{ID: paxos.NodeID(f.id), Addr: f.addr})
			})
		},
	}
	add.Flags().StringVar(&f.addr, "addr", "", "the node's HOST:PORT: where its API and direct transport answer (a node without one is reachable over RabbitMQ only)")
	remove := &cobra.Command{
		Use:     "remove --id N",
		Short:   "Remove node N from the group",
		Example: `  drover paxos members remove --id 3 --endpoints 127.0.0.1:7100,127.0.0.1:7101`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.paxosChange(cmd, f, "removed from", func(ctx context.Context, c *client.Client) error {
				return c.RemoveNode(ctx, paxos.NodeID(f.id))
			})
		},
	}
	cmd.AddCommand(add, remove)
	return cmd
}

// paxosMemberFlags are the flags of drover paxos members add and remove.
type paxosMemberFlags struct {
	endpoints string
	timeout   time.Duration
	id        int64
	addr      string
}

// paxosChange checks the flags and makes a membership change.
func (a *app) paxosChange(cmd *cobra.Command, f *paxosMemberFlags, done string, change func(context.Context, *client.Client) error) error {
	if err := a.checkGlobal(); err != nil {
		return err
	}
	if !cmd.Flags().Changed("id") || f.id < 0 {
		return &drover.InputError{Field: "--id", Value: f.id, Rule: "is required: the node's id, 0 or more"}
	}
	if f.addr != "" {
		if err := checkHostPort("--addr", f.addr); err != nil {
			return err
		}
	}
	if f.timeout <= 0 {
		return &drover.InputError{Field: "--timeout", Value: f.timeout, Rule: "must be positive"}
	}
	c, err := paxosClient(f.endpoints)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(cmd.Context()) }()
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	if err := change(ctx, c); err != nil {
		return paxosError(err)
	}
	fmt.Fprintf(a.stdout, "node %d %s the group\n", f.id, done)
	return nil
}
