package cli

import (
	"errors"
	"net/url"
	"strings"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/spf13/pflag"
)

// clusterFlags are the server's flags for a member of a cluster of
// several embedded etcd servers.
type clusterFlags struct {
	name            string
	initialCluster  string
	state           string
	advertiseClient string
	advertisePeer   string
	join            string
}

// clusterFlagNames are the flags of clusterFlags, refused with an external
// etcd.
var clusterFlagNames = []string{"name", "initial-cluster", "initial-cluster-state", "etcd-advertise-client", "etcd-advertise-peer", "join"}

func (c *clusterFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&c.name, "name", cluster.DefaultMemberName, "this member's name; with --initial-cluster, one of its names")
	fl.StringVar(&c.initialCluster, "initial-cluster", "", "every member of a new cluster, this one included: NAME=PEER-URL,NAME=PEER-URL,... (default: this member alone)")
	fl.StringVar(&c.state, "initial-cluster-state", cluster.ClusterStateNew, "new (the --initial-cluster members start a cluster together) or existing (this member was added to a running one)")
	fl.StringVar(&c.advertiseClient, "etcd-advertise-client", "", "URL the members and clients reach this member's clients port at (default --etcd-listen; required when that is 0.0.0.0 in a cluster)")
	fl.StringVar(&c.advertisePeer, "etcd-advertise-peer", "", "URL the other members reach this member's peer port at (default --etcd-peer-listen; required when that is 0.0.0.0)")
	fl.StringVar(&c.join, "join", "", "client URLs of a running cluster's members, comma-separated: add this member to it (as a learner, promoted once caught up)")
}

// apply sets the cluster fields of cfg.
func (c *clusterFlags) apply(cfg *cluster.EmbedConfig) {
	cfg.Name = c.name
	cfg.InitialCluster = strings.TrimSpace(c.initialCluster)
	cfg.InitialClusterState = c.state
	cfg.AdvertiseClientURL = c.advertiseClient
	cfg.AdvertisePeerURL = c.advertisePeer
	if c.join != "" {
		cfg.Join = strings.Split(c.join, ",")
		for i := range cfg.Join {
			cfg.Join[i] = strings.TrimSpace(cfg.Join[i])
		}
	}
}

// embedFlags maps EmbedConfig's fields to the server's flags.
var embedFlags = map[string]string{
	"ClientURL":           "--etcd-listen",
	"PeerURL":             "--etcd-peer-listen",
	"AdvertiseClientURL":  "--etcd-advertise-client",
	"AdvertisePeerURL":    "--etcd-advertise-peer",
	"Name":                "--name",
	"InitialCluster":      "--initial-cluster",
	"InitialClusterState": "--initial-cluster-state",
	"Join":                "--join",
	"DataDir":             "--data-dir",
}

// restoreFlags maps RestoreConfig's fields to the restore command's flags.
var restoreFlags = map[string]string{
	"Snapshot":       "FILE",
	"SHA256":         "--sha256",
	"DataDir":        "--data-dir",
	"Name":           "--name",
	"InitialCluster": "--initial-cluster",
	"PeerURL":        "--etcd-advertise-peer",
}

// embedFlagError names the server's flag of an EmbedConfig field in an
// InputError.
func embedFlagError(err error) error { return renameField(err, embedFlags) }

// renameField names the flag of a config field in an InputError.
func renameField(err error, flags map[string]string) error {
	var ie *drover.InputError
	if !errors.As(err, &ie) {
		return err
	}
	flag, ok := flags[ie.Field]
	if !ok {
		return err
	}
	return ie.Renamed(flag)
}

// exposed lists the listen URLs of cfg that bind beyond loopback.
func exposed(cfg cluster.EmbedConfig) []string {
	var out []string
	for _, raw := range []string{cfg.ClientURL, cfg.PeerURL} {
		u, err := url.Parse(raw)
		if err == nil && !loopback(u.Hostname()) {
			out = append(out, raw)
		}
	}
	return out
}
