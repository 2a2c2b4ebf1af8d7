package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MemberStatus is one member of a cluster: what the member list says of
// it, and what it reports of itself (etcd's maintenance Status).
type MemberStatus struct {
	Name       string
	ID         uint64
	PeerURLs   []string
	ClientURLs []string
	Learner    bool
	// The fields below come from the member itself; Err says why they are
	// missing (the member did not answer, or has not started).
	Err error
	// Leader is set on the member that says it leads.
	Leader bool
	// Endpoint is the client URL that answered.
	Endpoint string
	// RaftIndex, RaftAppliedIndex and RaftTerm are the member's raft
	// log position and term.
	RaftIndex, RaftAppliedIndex, RaftTerm uint64
	// DBSize is the member's database file's size, DBSizeInUse the part
	// of it in use, in bytes.
	DBSize, DBSizeInUse int64
	// Revision is the member's store revision.
	Revision int64
	// Version is the member's etcd version.
	Version string
}

// MemberStatuses lists the members of the cluster cli reaches, sorted by
// name, each with the status it reports, asked of every member at once and
// of each no longer than timeout. It fails only when the member list cannot
// be read; a member that does not answer has its Err set.
func MemberStatuses(ctx context.Context, cli *clientv3.Client, timeout time.Duration) ([]MemberStatus, error) {
	// Serializable: a member without a leader answers from its own state
	// (a linearizable read would wait for a leader forever), bounded too.
	lctx, cancel := context.WithTimeout(ctx, timeout)
	list, err := cli.MemberList(lctx, clientv3.WithSerializable())
	cancel()
	if err != nil {
		return nil, fmt.Errorf("cluster: list the members: %w", err)
	}
	out := make([]MemberStatus, len(list.Members))
	var wg sync.WaitGroup
	for i, m := range list.Members {
		out[i] = MemberStatus{Name: m.Name, ID: m.ID, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner}
		wg.Add(1)
		go func(st *MemberStatus) {
			defer wg.Done()
			st.fill(ctx, cli, timeout)
		}(&out[i])
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// fill asks the member for its status at each of its client URLs in turn.
func (st *MemberStatus) fill(ctx context.Context, cli *clientv3.Client, timeout time.Duration) {
	if len(st.ClientURLs) == 0 {
		st.Err = errors.New("not started: the member was added but has not joined yet")
		return
	}
	for _, ep := range st.ClientURLs {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		sr, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			st.Err = fmt.Errorf("no answer at %s: %w", ep, err)
			continue
		}
		st.Err, st.Endpoint = nil, ep
		st.Leader = sr.Leader != 0 && sr.Leader == sr.Header.MemberId
		st.RaftIndex, st.RaftAppliedIndex, st.RaftTerm = sr.RaftIndex, sr.RaftAppliedIndex, sr.RaftTerm
		st.DBSize, st.DBSizeInUse, st.Revision, st.Version = sr.DbSize, sr.DbSizeInUse, sr.Header.Revision, sr.Version
		return
	}
}

// ErrNoMember is matched by the error of RemoveMember when no member has
// the name or id it was given.
var ErrNoMember = errors.New("cluster: no such member")

// removeTimeout bounds RemoveMember: without a quorum etcd never answers.
const removeTimeout = 15 * time.Second

// RemoveMember removes the member named nameOrID (its name, or its id in
// hex as `drover cluster status` shows it) from the cluster cli reaches,
// and returns it. etcd refuses a removal that would leave fewer started
// members than a quorum. The removed member's server stops by itself.
func RemoveMember(ctx context.Context, cli *clientv3.Client, nameOrID string) (*pb.Member, error) {
	ctx, cancel := context.WithTimeout(ctx, removeTimeout)
	defer cancel()
	list, err := cli.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		return nil, fmt.Errorf("cluster: list the members: %w", err)
	}
	var found []*pb.Member
	var names []string
	for _, m := range list.Members {
		id := strconv.FormatUint(m.ID, 16)
		if m.Name == nameOrID || strings.EqualFold(id, nameOrID) {
			found = append(found, m)
		}
		names = append(names, fmt.Sprintf("%s (%s)", m.Name, id))
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("%w: %q names no member; the members are %s", ErrNoMember, nameOrID, strings.Join(names, ", "))
	case 1:
	default:
		return nil, fmt.Errorf("cluster: %q names %d members: give the member's id instead (%s)", nameOrID, len(found), strings.Join(names, ", "))
	}
	_, err = cli.MemberRemove(ctx, found[0].ID)
	if errors.Is(err, rpctypes.ErrUnhealthy) {
		return nil, fmt.Errorf("cluster: remove member %s (%x): %w: etcd refuses it while the rest of the cluster has not been connected for 5 s, "+
			"or when it would leave too few members running for a quorum: start the members that are down, or wait and try again", found[0].Name, found[0].ID, err)
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: remove member %s (%x): %w", found[0].Name, found[0].ID, err)
	}
	return found[0], nil
}
