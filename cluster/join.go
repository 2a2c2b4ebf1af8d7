package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
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
// cluster (or an unstarted one with its peer URL that it took over) did not
// start. Embed then removes the member again: Removed says it did, and the
// cluster lists the members it listed before; when the removal failed too
// (RemoveErr), the cluster lists the member, unstarted.
type JoinError struct {
	Cause   error
	ID      uint64
	PeerURL string
	// Removed is set when the member was removed from the cluster again.
	Removed bool
	// RemoveErr is why it could not be, when it could not.
	RemoveErr error
}

// Error implements error.
func (e *JoinError) Error() string {
	if e.Removed {
		return fmt.Sprintf("%v\nthis member (id %x, peer URL %s) was added to the cluster to join it, did not start, and was removed again, "+
			"so the cluster lists the members it listed before: fix the cause and start again with the same flags", e.Cause, e.ID, e.PeerURL)
	}
	return fmt.Sprintf("%v\nthe cluster now lists this member (id %x, peer URL %s) unstarted (a learner does not count for its quorum), and removing it failed: %v; "+
		"start again with the same flags, which reuses it, or remove it with `drover cluster remove %x`", e.Cause, e.ID, e.PeerURL, e.RemoveErr, e.ID)
}

// Unwrap returns the cause.
func (e *JoinError) Unwrap() error { return e.Cause }

// joinUndoTimeout bounds how long Embed tries to remove a member it added
// but could not start.
const joinUndoTimeout = 15 * time.Second

// undoJoin removes the member Embed added (or took over) when its start
// failed with cause, logs it and returns cause as a *JoinError. The data
// dir held no member before the start (Embed joins only then): when the
// start wrote a member directory into it (memberDirBefore false) and has
// returned (ctx not done; when it is, etcd's own start may still be
// running), that directory is removed too, so that a retry joins afresh
// rather than restart as the removed member.
func undoJoin(ctx context.Context, cfg EmbedConfig, added *addedMember, cause error, memberDirBefore bool) error {
	je := &JoinError{Cause: cause, ID: added.id, PeerURL: cfg.AdvertisePeerURL}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), joinUndoTimeout)
	defer cancel()
	id := fmt.Sprintf("%x", added.id)
	if err := removeAdded(rctx, cfg.Join, added.id); err != nil {
		je.RemoveErr = err
		cfg.Logger.Error("cluster: join: this member did not start, and it could not be removed from the cluster again; remove it with drover cluster remove",
			"member_id", id, "peer_url", cfg.AdvertisePeerURL, "cause", cause, "err", err)
		return je
	}
	je.Removed = true
	if !memberDirBefore && ctx.Err() == nil {
		if err := os.RemoveAll(filepath.Join(cfg.DataDir, "member")); err != nil {
			cfg.Logger.Warn("cluster: join: remove the member directory the failed start wrote; remove it before starting again",
				"dir", filepath.Join(cfg.DataDir, "member"), "err", err)
		}
	}
	cfg.Logger.Warn("cluster: join: this member did not start; removed it from the cluster again",
		"member_id", id, "peer_url", cfg.AdvertisePeerURL, "cause", cause)
	return je
}

// removeAdded removes member id from the cluster at endpoints; a member
// already gone is no error.
func removeAdded(ctx context.Context, endpoints []string, id uint64) error {
	cli, err := Connect(ctx, ClientConfig{Endpoints: endpoints})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", strings.Join(endpoints, ","), err)
	}
	defer cli.Close()
	if _, err := cli.MemberRemove(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrMemberNotFound) {
		return fmt.Errorf("remove member %x: %w", id, err)
	}
	return nil
}

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
	id, err := reusable(list.Members, cfg)
	if err != nil {
		return nil, err
	}
	members := list.Members
	if id == 0 {
		resp, err := addLearner(ctx, cli, cfg.AdvertisePeerURL)
		if errors.Is(err, rpctypes.ErrTooManyLearners) {
			return nil, fmt.Errorf("cluster: join: add %s: %w: another member is still joining; wait until it is promoted (`drover cluster status`), or remove it", cfg.AdvertisePeerURL, err)
		}
		if err != nil {
			return nil, fmt.Errorf("cluster: join: add %s as a learner: %w", cfg.AdvertisePeerURL, err)
		}
		id, members = resp.Member.ID, resp.Members
	}
	ic, err := initialCluster(members, id, cfg.Name)
	if err != nil {
		// Another member was added unstarted meanwhile: this one cannot
		// start either; take it out again rather than leave it.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), joinUndoTimeout)
		defer rcancel()
		if rerr := removeAdded(rctx, cfg.Join, id); rerr != nil {
			return nil, fmt.Errorf("%w (and this member, id %x, could not be removed again: %v; remove it with `drover cluster remove %x`)", err, id, rerr, id)
		}
		return nil, err
	}
	return &addedMember{id: id, initialCluster: ic}, nil
}

// reusable checks the members of the cluster to join for cfg's: it returns
// the id of a member with cfg's peer URL that was added but never started
// (an earlier attempt that failed), to be reused, or 0. It refuses a
// started member with that peer URL or cfg's name, and another member that
// was added but never started (the new member could not start with it in
// its initial cluster).
func reusable(members []*pb.Member, cfg EmbedConfig) (uint64, error) {
	var id uint64
	for _, m := range members {
		switch {
		case hasURL(m.PeerURLs, cfg.AdvertisePeerURL) && m.Name == "":
			id = m.ID // added before, never started: reuse it
		case hasURL(m.PeerURLs, cfg.AdvertisePeerURL):
			return 0, fmt.Errorf("cluster: join: member %s (id %x) already has peer URL %s, and data dir %s holds no member: "+
				"if that member is this one, which lost its data, remove it first with `drover cluster remove %s`, then join again", m.Name, m.ID, cfg.AdvertisePeerURL, cfg.DataDir, m.Name)
		case m.Name == cfg.Name:
			return 0, fmt.Errorf("cluster: join: the cluster has a member named %s already (id %x, peer URL %s): choose another name, or remove that member first",
				m.Name, m.ID, strings.Join(m.PeerURLs, ","))
		}
	}
	for _, m := range members {
		if m.Name == "" && m.ID != id {
			return 0, fmt.Errorf("cluster: join: member %x (peer URL %s) was added but has not started: if it is joining now, wait until it has (`drover cluster status`), "+
				"then join again; else remove it with `drover cluster remove %x`", m.ID, strings.Join(m.PeerURLs, ","), m.ID)
		}
	}
	return id, nil
}

// addLearner adds a learner with peerURL. etcd refuses a member while its
// leader has been connected to every member for less than 5 s (a cluster
// that has just started, or lost a member): addLearner asks again every
// half second until ctx ends. It asks again too when etcd answers "member
// not found": a new member's id derives from its peer URLs and the current
// second, and etcd refuses the id of a member removed before (one with
// this peer URL that failed to start, removed in the same second).
func addLearner(ctx context.Context, cli *clientv3.Client, peerURL string) (*clientv3.MemberAddResponse, error) {
	for {
		resp, err := cli.MemberAddAsLearner(ctx, []string{peerURL})
		if !errors.Is(err, rpctypes.ErrUnhealthy) && !errors.Is(err, rpctypes.ErrMemberNotFound) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			if errors.Is(err, rpctypes.ErrMemberNotFound) {
				return nil, fmt.Errorf("%w (etcd kept refusing the new member's id as one removed before)", err)
			}
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
