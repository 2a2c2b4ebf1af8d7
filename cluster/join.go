package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/wal"
)

// HasMember reports whether dir holds an etcd member's data (its
// write-ahead log): a server started on it rejoins the member's cluster.
func HasMember(dir string) bool { return wal.Exist(filepath.Join(dir, "member", "wal")) }

// JoinError is returned by Embed when a member it added to a running
// cluster did not start. The cluster lists the member, unstarted; as a
// learner it does not count for the cluster's quorum.
type JoinError struct {
	Cause   error
	ID      uint64
	PeerURL string
}

// Error implements error.
func (e *JoinError) Error() string {
	return fmt.Sprintf("%v\nthe cluster now lists this member (id %x, peer URL %s) as an unstarted learner, which does not count for its quorum: "+
		"start again with the same flags, which reuses it, or remove it with `drover cluster remove %x`", e.Cause, e.ID, e.PeerURL, e.ID)
}

// Unwrap returns the cause.
func (e *JoinError) Unwrap() error { return e.Cause }

// addedMember is a member added to a running cluster, and the initial
// cluster it starts with.
type addedMember struct {
	id             uint64
	initialCluster string
}

// addMember adds the member of cfg to the running cluster at cfg.Join as a
// learner, and returns the initial cluster it starts with: every member of
// the cluster with its peer URLs. A member with the same peer URL that was
// added but never started (an earlier attempt that failed) is reused.
func addMember(ctx context.Context, cfg EmbedConfig) (*addedMember, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	cli, err := Connect(ctx, ClientConfig{Endpoints: cfg.Join})
	if err != nil {
		return nil, fmt.Errorf("cluster: join %s: %w", strings.Join(cfg.Join, ","), err)
	}
	defer cli.Close()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: join: list the members: %w", err)
	}
	var id uint64
	members := list.Members
	for _, m := range members {
		switch {
		case hasURL(m.PeerURLs, cfg.AdvertisePeerURL) && m.Name == "":
			id = m.ID // added before, never started: reuse it
		case hasURL(m.PeerURLs, cfg.AdvertisePeerURL):
			return nil, fmt.Errorf("cluster: join: member %s (id %x) already has peer URL %s, and data dir %s holds no member: "+
				"if that member is this one, which lost its data, remove it first with `drover cluster remove %s`, then join again", m.Name, m.ID, cfg.AdvertisePeerURL, cfg.DataDir, m.Name)
		case m.Name == cfg.Name:
			return nil, fmt.Errorf("cluster: join: the cluster has a member named %s already (id %x, peer URL %s): choose another name, or remove that member first",
				m.Name, m.ID, strings.Join(m.PeerURLs, ","))
		}
	}
	if id == 0 {
		resp, err := addLearner(ctx, cli, cfg.AdvertisePeerURL)
		if errors.Is(err, rpctypes.ErrTooManyLearners) {
			return nil, fmt.Errorf("cluster: join: add %s: %w: another member is still joining; wait until it is promoted (`drover cluster status`), or remove it", cfg.AdvertisePeerURL, err)
		}
		if err != nil {
			return nil, fmt.Errorf("cluster: join: add %s as a learner: %w", cfg.AdvertisePeerURL, err)
		}
		id, members = resp.Member.ID, resp.Members
		ic, err := initialCluster(members, id, cfg.Name)
		if err != nil {
			// Added now, and it cannot start: take it out again rather
			// than leave a learner nobody starts.
			if _, rerr := cli.MemberRemove(ctx, id); rerr != nil {
				return nil, fmt.Errorf("%w (and this member, id %x, added as a learner, could not be removed again: %v; remove it with `drover cluster remove %x`)", err, id, rerr, id)
			}
			return nil, err
		}
		return &addedMember{id: id, initialCluster: ic}, nil
	}
	ic, err := initialCluster(members, id, cfg.Name)
	if err != nil {
		return nil, err
	}
	return &addedMember{id: id, initialCluster: ic}, nil
}

// addLearner adds a learner with peerURL. etcd refuses a member while its
// leader has been connected to every member for less than 5 s (a cluster
// that has just started, or lost a member): addLearner asks again every
// half second until ctx ends.
func addLearner(ctx context.Context, cli *clientv3.Client, peerURL string) (*clientv3.MemberAddResponse, error) {
	for {
		resp, err := cli.MemberAddAsLearner(ctx, []string{peerURL})
		if !errors.Is(err, rpctypes.ErrUnhealthy) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (the cluster stayed unhealthy: is a member down?)", err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// initialCluster lists members as etcd's --initial-cluster, naming member
// self name.
func initialCluster(members []*pb.Member, self uint64, name string) (string, error) {
	var pairs []string
	for _, m := range members {
		n := m.Name
		if m.ID == self {
			n = name
		} else if n == "" {
			return "", fmt.Errorf("cluster: join: member %x (peer URL %s) was added but never started: start it first, or remove it with `drover cluster remove %x`",
				m.ID, strings.Join(m.PeerURLs, ","), m.ID)
		}
		for _, u := range m.PeerURLs {
			pairs = append(pairs, n+"="+u)
		}
	}
	return strings.Join(pairs, ","), nil
}

func hasURL(urls []string, u string) bool {
	for _, x := range urls {
		if sameURL(x, u) {
			return true
		}
	}
	return false
}

// promoteRetry is how often promote asks again while the learner catches
// up with the leader.
const promoteRetry = 200 * time.Millisecond

// promote makes the server, a learner, a voting member once it has caught
// up with the leader, asking the members at cfg.Join and the voters it
// knows of, and waits until the server has applied its promotion. It gives
// up after cfg.StartTimeout.
func (s *Server) promote(ctx context.Context, cfg EmbedConfig) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	self := s.etcd.Server.MemberID()
	eps := append([]string(nil), cfg.Join...)
	for _, m := range s.etcd.Server.Cluster().Members() {
		if m.ID != self && !m.IsLearner {
			eps = append(eps, m.ClientURLs...)
		}
	}
	cli, err := Connect(ctx, ClientConfig{Endpoints: eps})
	if err != nil {
		return fmt.Errorf("cluster: promote this learner (id %x): %w", uint64(self), err)
	}
	defer cli.Close()
	for {
		_, err := cli.MemberPromote(ctx, uint64(self))
		if err == nil || errors.Is(err, rpctypes.ErrMemberNotLearner) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: promote this learner (id %x) within %s: %w (last: %v)", uint64(self), cfg.StartTimeout, ctx.Err(), err)
		case <-time.After(promoteRetry):
		}
	}
	for s.etcd.Server.IsLearner() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: promoted, but this member had not applied it within %s: %w", cfg.StartTimeout, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
