package cluster

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/droverhq/drover"
)

// Defaults of [EmbedConfig].
const (
	DefaultDataDir                 = "./drover-data"
	DefaultClientURL               = "http://127.0.0.1:2379"
	DefaultPeerURL                 = "http://127.0.0.1:2380"
	DefaultMemberName              = "drover"
	DefaultAutoCompactionRetention = time.Hour
	DefaultStartTimeout            = 60 * time.Second
	// DefaultQuotaBackendBytes is the embedded etcd's database quota.
	DefaultQuotaBackendBytes = 4 << 30
	// DefaultDefragInterval is how often the embedded server checks
	// whether its database file is worth defragmenting.
	DefaultDefragInterval = 10 * time.Minute
)

// Initial cluster states of [EmbedConfig.InitialClusterState], as etcd's
// --initial-cluster-state.
const (
	ClusterStateNew      = "new"
	ClusterStateExisting = "existing"
)

// EmbedConfig configures an embedded etcd server: a single member by
// default, or one member of a cluster of several (InitialCluster, or Join).
// The zero value is valid and means the defaults.
type EmbedConfig struct {
	// DataDir holds etcd's data; it survives restarts. Default ./drover-data.
	DataDir string
	// ClientURL is where etcd serves clients. Default http://127.0.0.1:2379.
	ClientURL string
	// PeerURL is etcd's peer listener. Default http://127.0.0.1:2380. A
	// single member listens on a loopback address only; a member of a
	// cluster (InitialCluster or Join set) on any address it is given.
	PeerURL string
	// AdvertiseClientURL is the URL other members and clients are told to
	// reach this member's clients port at; default ClientURL. Required
	// in a cluster when ClientURL listens on every address (0.0.0.0).
	AdvertiseClientURL string
	// AdvertisePeerURL is the URL the other members reach this member's
	// peer port at; default PeerURL. Required when PeerURL listens on
	// every address.
	AdvertisePeerURL string
	// Name is the member name. Default "drover".
	Name string
	// InitialCluster lists every member of a new cluster, this one
	// included, as NAME=PEER-URL pairs separated by commas, as etcd's
	// --initial-cluster. Empty means this member alone. It is read only
	// when DataDir holds no member yet: a restarted member knows its
	// cluster.
	InitialCluster string
	// InitialClusterState is ClusterStateNew (default: the members listed
	// in InitialCluster start a cluster together) or ClusterStateExisting
	// (this member was added to a running cluster, which InitialCluster
	// lists as it is now).
	InitialClusterState string
	// Join lists client URLs of members of a running cluster. When DataDir
	// holds no member yet, Embed adds this member to that cluster (as a
	// learner, promoted to a voter once it has caught up) and starts it as
	// an existing cluster's member. InitialCluster must be empty.
	Join []string
	// AutoCompactionRetention keeps this much history; older revisions are
	// compacted periodically. Zero means one hour; negative turns compaction
	// off.
	AutoCompactionRetention time.Duration
	// UnsafeNoFsync skips fsync: much faster, loses data on a machine crash.
	// For tests and throw-away runs only.
	UnsafeNoFsync bool
	// LogLevel is etcd's own log level ("debug", "info", "warn", "error").
	// Default "error": drover logs what matters itself.
	LogLevel string
	// StartTimeout bounds how long Embed waits for the server to be ready
	// (in a new cluster, for a quorum of members to start) and for a
	// joining member to be promoted. Default one minute.
	StartTimeout time.Duration
	// QuotaBackendBytes is the database quota (default 4 GiB). Past it etcd
	// refuses writes until space is freed.
	QuotaBackendBytes int64
	// Logger receives what Embed logs of its own (a joining member that
	// did not start, removed from the cluster again). Default
	// slog.Default().
	Logger *slog.Logger
	// DefragInterval is how often the server checks its database file and
	// defragments it when at least 64 MiB and half of it is free space
	// left by compaction. Zero means 10 minutes; negative turns it off.
	DefragInterval time.Duration
}

func (c EmbedConfig) withDefaults() EmbedConfig {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.ClientURL == "" {
		c.ClientURL = DefaultClientURL
	}
	if c.PeerURL == "" {
		c.PeerURL = DefaultPeerURL
	}
	if c.AdvertiseClientURL == "" {
		c.AdvertiseClientURL = c.ClientURL
	}
	if c.AdvertisePeerURL == "" {
		c.AdvertisePeerURL = c.PeerURL
	}
	if c.Name == "" {
		c.Name = DefaultMemberName
	}
	if c.InitialClusterState == "" {
		c.InitialClusterState = ClusterStateNew
	}
	if c.InitialCluster == "" && len(c.Join) == 0 {
		c.InitialCluster = c.Name + "=" + c.AdvertisePeerURL
	}
	if c.AutoCompactionRetention == 0 {
		c.AutoCompactionRetention = DefaultAutoCompactionRetention
	}
	if c.LogLevel == "" {
		c.LogLevel = "error"
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.QuotaBackendBytes == 0 {
		c.QuotaBackendBytes = DefaultQuotaBackendBytes
	}
	if c.DefragInterval == 0 {
		c.DefragInterval = DefaultDefragInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// clustered reports whether the member is, or is to be, one of several:
// the user gave an initial cluster (before defaults) or a cluster to join.
func (c EmbedConfig) clustered() bool { return c.InitialCluster != "" || len(c.Join) > 0 }

// Validate reports the first field that is not usable, as a
// drover.InputError naming it.
func (c EmbedConfig) Validate() error {
	clustered := c.clustered()
	if err := c.validateListeners(clustered); err != nil {
		return err
	}
	c = c.withDefaults()
	if err := c.validateMembership(clustered); err != nil {
		return err
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return &drover.InputError{Field: "LogLevel", Value: c.LogLevel, Rule: "must be debug, info, warn or error"}
	}
	if c.StartTimeout < 0 {
		return &drover.InputError{Field: "StartTimeout", Value: c.StartTimeout, Rule: "must not be negative"}
	}
	return nil
}

// validateListeners checks the listen and advertise URLs.
func (c EmbedConfig) validateListeners(clustered bool) error {
	d := c.withDefaults()
	if !listenURL(d.ClientURL, false) {
		return &drover.InputError{Field: "ClientURL", Value: d.ClientURL, Rule: "must be http(s)://IP:PORT with no path, such as http://127.0.0.1:2379"}
	}
	if !listenURL(d.PeerURL, !clustered) {
		if clustered {
			return &drover.InputError{Field: "PeerURL", Value: d.PeerURL, Rule: "must be http(s)://IP:PORT with no path, such as http://10.0.0.5:2380"}
		}
		return &drover.InputError{Field: "PeerURL", Value: d.PeerURL, Rule: "must be http(s)://LOOPBACK-IP:PORT with no path, such as http://127.0.0.1:2380: " +
			"a single member has no peers; only a member of a cluster (an initial cluster, or a join) listens for peers beyond loopback"}
	}
	if hostPort(d.ClientURL) == hostPort(d.PeerURL) {
		return &drover.InputError{Field: "PeerURL", Value: d.PeerURL, Rule: "must not be the client URL's address and port: the two listeners need a port each"}
	}
	for _, a := range []struct{ field, adv, listen, example string }{
		{"AdvertiseClientURL", c.AdvertiseClientURL, d.ClientURL, "http://drover-0.drover:2379"},
		{"AdvertisePeerURL", c.AdvertisePeerURL, d.PeerURL, "http://drover-0.drover:2380"},
	} {
		if a.adv != "" {
			if !hostURL(a.adv) {
				return &drover.InputError{Field: a.field, Value: a.adv, Rule: "must be http(s)://HOST:PORT with no path, a host that is not 0.0.0.0, such as " + a.example}
			}
			continue
		}
		if clustered && unspecified(a.listen) {
			return &drover.InputError{Field: a.field, Rule: "is required when the listener binds every address (" + a.listen + "): " +
				"the other members and the clients need an address that reaches this member, such as " + a.example}
		}
	}
	return nil
}

// validateMembership checks the name, the initial cluster and the join
// endpoints of a config with defaults.
func (c EmbedConfig) validateMembership(clustered bool) error {
	if !memberName(c.Name) {
		return &drover.InputError{Field: "Name", Value: c.Name, Rule: "must be 1 to 64 letters, digits, '-', '_' or '.'"}
	}
	if c.InitialClusterState != ClusterStateNew && c.InitialClusterState != ClusterStateExisting {
		return &drover.InputError{Field: "InitialClusterState", Value: c.InitialClusterState, Rule: "must be new or existing"}
	}
	if len(c.Join) > 0 {
		for _, ep := range c.Join {
			if strings.TrimSpace(ep) == "" {
				return &drover.InputError{Field: "Join", Value: strings.Join(c.Join, ","), Rule: "must list client URLs of running members, with no empty entry"}
			}
		}
		if c.InitialCluster != "" {
			return &drover.InputError{Field: "InitialCluster", Value: c.InitialCluster, Rule: "must be empty when joining: a joining member reads the members from the cluster"}
		}
		return nil
	}
	members, err := ParseInitialCluster(c.InitialCluster)
	if err != nil {
		return err
	}
	peer, ok := members[c.Name]
	if !ok {
		return &drover.InputError{Field: "Name", Value: c.Name, Rule: "must be one of the names in the initial cluster (" + strings.Join(sortedNames(members), ", ") + ")"}
	}
	if !sameURL(peer, c.AdvertisePeerURL) {
		field := "AdvertisePeerURL"
		if !clustered || c.AdvertisePeerURL == c.PeerURL {
			field = "PeerURL"
		}
		return &drover.InputError{Field: field, Value: c.AdvertisePeerURL, Rule: fmt.Sprintf("must be %s's peer URL in the initial cluster, %s", c.Name, peer)}
	}
	if c.InitialClusterState == ClusterStateExisting && len(members) < 2 {
		return &drover.InputError{Field: "InitialClusterState", Value: c.InitialClusterState, Rule: "existing needs the initial cluster to list the running members as well as this one (or join instead)"}
	}
	return nil
}

// ParseInitialCluster parses NAME=PEER-URL pairs separated by commas, as
// etcd's --initial-cluster, into peer URLs by member name. Each name appears
// once, with one http(s)://HOST:PORT URL, and no two names share a URL.
func ParseInitialCluster(s string) (map[string]string, error) {
	bad := func(rule string) error { return &drover.InputError{Field: "InitialCluster", Value: s, Rule: rule} }
	members := map[string]string{}
	byURL := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		name, peer, ok := strings.Cut(pair, "=")
		switch {
		case pair == "":
			return nil, bad("must be NAME=PEER-URL pairs separated by commas, such as s1=http://10.0.0.1:2380,s2=http://10.0.0.2:2380, with no empty entry")
		case !ok:
			return nil, bad(fmt.Sprintf("entry %q must be NAME=PEER-URL", pair))
		case !memberName(name):
			return nil, bad(fmt.Sprintf("name %q must be 1 to 64 letters, digits, '-', '_' or '.'", name))
		case !hostURL(peer):
			return nil, bad(fmt.Sprintf("%s's peer URL %q must be http(s)://HOST:PORT with no path", name, peer))
		}
		if _, dup := members[name]; dup {
			return nil, bad(fmt.Sprintf("name %s appears twice", name))
		}
		if other, dup := byURL[normURL(peer)]; dup {
			return nil, bad(fmt.Sprintf("%s and %s have the same peer URL %s", other, name, peer))
		}
		members[name], byURL[normURL(peer)] = peer, name
	}
	return members, nil
}

func sortedNames(m map[string]string) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// memberName reports whether s is a usable member name.
func memberName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// hostPort is the host and port of a URL that listenURL accepted.
func hostPort(raw string) string {
	u, _ := url.Parse(raw)
	return u.Host
}

// listenURL reports whether raw is a URL etcd can listen on: http or https,
// an IP address (etcd binds to IPs, not names; a loopback one if loopback is
// set) and a port, and no path.
func listenURL(raw string, loopback bool) bool {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return false
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || port == "" {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && (!loopback || ip.IsLoopback())
}

// hostURL reports whether raw is a URL others can reach a member at:
// http or https, a host name or an IP address that is not the unspecified
// one, a port, and no path.
func hostURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return false
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" || port == "" {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsUnspecified()
}

// unspecified reports whether a listen URL binds every address.
func unspecified(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	ip := net.ParseIP(u.Hostname())
	return ip != nil && ip.IsUnspecified()
}

// normURL is raw without a trailing slash, for comparisons.
func normURL(raw string) string { return strings.TrimSuffix(strings.TrimSpace(raw), "/") }

func sameURL(a, b string) bool { return normURL(a) == normURL(b) }
