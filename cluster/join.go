package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
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

// A joining member's start and the members' lag. etcd's start of a member
// joining a running cluster (initial cluster state existing) fetches the
// membership from the other members' peer URLs, in sorted order, takes the
// first answer, and refuses to start ("member count is unequal") when that
// answer does not list the member being started. The MemberAdd that added it
// returned once the member that served it had applied the change; the
// others apply it a moment later, and one that lags answers without it. A
// join therefore does both:
//
//   - before each start, awaitListed waits (at most listedWait) until every
//     other member that answers lists the new member. It asks each member's
//     client URL for a serializable member list: the membership that
//     member has applied, the same one its peer URL serves to etcd's start.
//     A member that does not answer (down, or slower than
//     listedCallTimeout) does not hold the join up: etcd's start goes on to
//     the next peer when one does not answer it either.
//   - a start that fails with that error all the same (a member that did
//     not answer the wait answered etcd's start, or lagged past listedWait)
//     is retried, up to joinStartTries starts with a growing pause between
//     them, the member directory the failed start wrote removed first; only
//     then is the member removed from the cluster again (undoJoin).
//
// The wait avoids the failure in the common case at the cost of one round of
// member lists; the retry covers what the wait cannot see.
const (
	listedPoll     = 100 * time.Millisecond
	joinStartTries = 3
	joinRetryPause = 500 * time.Millisecond
	// memberCountUnequal is etcd's error when the membership a peer
	// answered has another count than the initial cluster (etcd has no
	// sentinel error for it).
	memberCountUnequal = "member count is unequal"
)

// The wait's bounds, and seams for tests (set through export_test.go;
// nil otherwise).
var (
	listedWait        = 15 * time.Second
	listedCallTimeout = 2 * time.Second
	// listedHook gets the members the member at endpoint listed to
	// awaitListed and returns those awaitListed goes by.
	listedHook func(endpoint string, members []*pb.Member) []*pb.Member
	// joinStartHook runs before each start of a joining member (try
	// counts from 1); an error it returns is that start's error.
	joinStartHook func(dataDir string, try int) error
)

// startJoining starts the member Embed added, waiting until the other
// members list it and retrying a start a lagging member refused, as the
// comment on the constants above says. The member directory is removed between tries
// only when there was none before (memberDirBefore false).
func startJoining(ctx context.Context, cfg EmbedConfig, added *addedMember, memberDirBefore bool) (*Server, error) {
	for try := 1; ; try++ {
		if err := awaitListed(ctx, cfg, added); err != nil {
			return nil, err
		}
		var s *Server
		var err error
		if joinStartHook != nil {
			err = joinStartHook(cfg.DataDir, try)
		}
		if err != nil {
			err = fmt.Errorf("cluster: start embedded etcd in %s on %s: %w", cfg.DataDir, cfg.ClientURL, err)
		} else {
			s, err = start(ctx, cfg)
		}
		if err == nil || try == joinStartTries || memberDirBefore || ctx.Err() != nil || !strings.Contains(err.Error(), memberCountUnequal) {
			return s, err
		}
		cfg.Logger.Warn("cluster: join: a member answered this member's start without it (it had not applied its addition yet); starting again",
			"member_id", fmt.Sprintf("%x", added.id), "try", try, "err", err)
		if rerr := os.RemoveAll(filepath.Join(cfg.DataDir, "member")); rerr != nil {
			return nil, fmt.Errorf("%w (and the member directory that start wrote could not be removed to start again: %v)", err, rerr)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster: start embedded etcd: %w", ctx.Err())
		case <-time.After(time.Duration(try) * joinRetryPause):
		}
	}
}

// awaitListed waits until every other member of added's cluster that
// answers lists added, for at most listedWait; past it, it logs the members
// that still do not and returns nil (the start may succeed all the same:
// etcd asks one member only). It fails only when ctx ends.
func awaitListed(ctx context.Context, cfg EmbedConfig, added *addedMember) error {
	wctx, cancel := context.WithTimeout(ctx, listedWait)
	defer cancel()
	var clients []*clientv3.Client
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	for _, urls := range added.others {
		// Not connected yet: clientv3.New does not dial until a call.
		c, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: listedCallTimeout, Logger: zap.NewNop()})
		if err == nil { // else best effort: that member is not waited for
			clients = append(clients, c)
		}
	}
	for {
		var lagged bool
		clients, lagged = lagBehind(wctx, clients, added.id)
		if !lagged {
			return nil
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("cluster: join: wait until the members list this member: %w", ctx.Err())
			}
			var eps []string
			for _, c := range clients {
				eps = append(eps, c.Endpoints()...)
			}
			cfg.Logger.Warn("cluster: join: some members still do not list this member; starting all the same",
				"member_id", fmt.Sprintf("%x", added.id), "waited", listedWait, "members", strings.Join(eps, " "))
			return nil
		case <-time.After(listedPoll):
		}
	}
}

// lagBehind asks each member (a client to its client URLs) at once for its
// member list. It closes the clients of the members that list member id and
// returns the others', and whether any of those answered without it: a
// member that did not answer is asked again while another lags, but is not
// waited for by itself.
func lagBehind(ctx context.Context, clients []*clientv3.Client, id uint64) ([]*clientv3.Client, bool) {
	const lags, lists = 1, 2 // 0: no answer
	got := make([]int, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, listedCallTimeout)
			defer cancel()
			resp, err := c.MemberList(cctx, clientv3.WithSerializable())
			if err != nil {
				return
			}
			members := resp.Members
			if listedHook != nil {
				members = listedHook(c.Endpoints()[0], members)
			}
			got[i] = lags
			if slices.ContainsFunc(members, func(m *pb.Member) bool { return m.ID == id }) {
				got[i] = lists
			}
		}()
	}
	wg.Wait()
	var rest []*clientv3.Client
	lagged := false
	for i, c := range clients {
		if got[i] == lists {
			_ = c.Close()
			continue
		}
		rest = append(rest, c)
		lagged = lagged || got[i] == lags
	}
	return rest, lagged
}

// addedMember is a member added to a running cluster, the initial cluster
// it starts with, and the client URLs of each of the other members.
type addedMember struct {
	id             uint64
	initialCluster string
	others         [][]string
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
	added := &addedMember{id: id, initialCluster: ic}
	for _, m := range members {
		if m.ID != id && len(m.ClientURLs) > 0 {
			added.others = append(added.others, m.ClientURLs)
		}
	}
	return added, nil
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
