package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/membership"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// memberList is the cluster's members as "ID NAME PEER-URLS LEARNER",
// sorted.
func memberList(t *testing.T, cli *clientv3.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range l.Members {
		out = append(out, fmt.Sprintf("%x %s %v %v", m.ID, m.Name, m.PeerURLs, m.IsLearner))
	}
	sort.Strings(out)
	return out
}

// TestJoinThatCannotStartRemovesItsMember: a member joining a running
// cluster is added to it as a learner, then cannot start (its peer port is
// taken): Embed removes it again and logs it, so that the cluster lists the
// members it listed before and the data dir holds no member; the same
// join, once the port is free, succeeds.
func TestJoinThatCannotStartRemovesItsMember(t *testing.T) {
	dir := t.TempDir()
	// Registered first, run last, once both members have closed: peer
	// connections between two members of one process end only at etcd's
	// peer read timeout after they close.
	t.Cleanup(func() {
		etcdtest.Eventually(10*time.Second, func() bool { return goleak.Find(etcdtest.LeakOptions()...) == nil })
	})
	first := embed(t, filepath.Join(dir, "first"))
	cli := connect(t, first)
	before := memberList(t, cli)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var logs etcdtest.LogBuffer
	cfg := cluster.EmbedConfig{
		Name:           "joiner",
		DataDir:        filepath.Join(dir, "joiner"),
		ClientURL:      "http://" + etcdtest.FreeAddr(),
		PeerURL:        "http://" + taken.Addr().String(),
		Join:           []string{"http://" + first.Endpoints()[0]},
		UnsafeNoFsync:  true,
		DefragInterval: -1,
		StartTimeout:   60 * time.Second,
		Logger:         slog.New(slog.NewTextHandler(&logs, nil)),
	}
	s, err := cluster.Embed(context.Background(), cfg)
	if s != nil {
		_ = s.Close(context.Background())
		t.Fatal("the member started on a peer port that is taken")
	}
	var je *cluster.JoinError
	if !errors.As(err, &je) || !je.Removed || !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "was removed again") {
		t.Fatalf("Embed() = %v; want a JoinError with the member removed again, whose cause is the taken port", err)
	}
	if after := memberList(t, cli); !reflect.DeepEqual(after, before) {
		t.Fatalf("members after the failed join: %v, want those before it: %v", after, before)
	}
	if !strings.Contains(logs.String(), "removed it from the cluster again") || !strings.Contains(logs.String(), fmt.Sprintf("member_id=%x", je.ID)) {
		t.Fatalf("log: %q, want the removal of member %x", logs.String(), je.ID)
	}
	if cluster.HasMember(cfg.DataDir) {
		t.Fatalf("the failed join left a member in %s", cfg.DataDir)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "member")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the failed join left %s/member: %v", cfg.DataDir, err)
	}

	_ = taken.Close()
	joined, err := cluster.Embed(context.Background(), cfg)
	if err != nil {
		t.Fatalf("the same join with the port free: %v", err)
	}
	t.Cleanup(func() { _ = joined.Close(context.Background()) })
	if n := len(memberList(t, cli)); n != 2 || joined.Members() != 2 {
		t.Fatalf("after the join: %d members listed, the joined member sees %d; want 2", n, joined.Members())
	}
}

// joinConfig is the config of member name joining the cluster of servers.
func joinConfig(t *testing.T, servers []*cluster.Server, name string, logs *etcdtest.LogBuffer) cluster.EmbedConfig {
	return cluster.EmbedConfig{
		Name:           name,
		DataDir:        filepath.Join(t.TempDir(), name),
		ClientURL:      "http://" + etcdtest.FreeAddr(),
		PeerURL:        "http://" + etcdtest.FreeAddr(),
		Join:           []string{"http://" + servers[0].Endpoints()[0]},
		UnsafeNoFsync:  true,
		DefragInterval: -1,
		StartTimeout:   60 * time.Second,
		Logger:         slog.New(slog.NewTextHandler(logs, nil)),
	}
}

// TestJoinWaitsUntilTheMembersListIt: a member joining a three-member
// cluster starts only once every member lists it. Each member's first
// answer is made to lack it, as a member answers that has not applied the
// addition yet (etcd's start would then refuse with "member count is
// unequal"): the join asks each again, and starts once, after every one
// has listed it.
func TestJoinWaitsUntilTheMembersListIt(t *testing.T) {
	ms := startCluster(t, 0, 0, 0)
	var logs etcdtest.LogBuffer
	cfg := joinConfig(t, ms, "m3", &logs)
	// A member list that takes longer than the call timeout counts as no
	// answer, and a member that does not answer is not waited for: on a
	// loaded machine a slow answer must not let the join start early.
	cluster.SetListedTimeouts(t, 2*time.Minute, 2*time.Minute)
	var mu sync.Mutex
	asked := map[string]int{}     // member lists asked, by endpoint
	listed := map[string]bool{}   // whether the last one listed the joiner
	var atStart []map[string]bool // listed, at each start
	cluster.SetListedHook(t, func(ep string, members []*pb.Member) []*pb.Member {
		mu.Lock()
		defer mu.Unlock()
		asked[ep]++
		if asked[ep] == 1 {
			members = slices.DeleteFunc(slices.Clone(members), func(m *pb.Member) bool { return slices.Contains(m.PeerURLs, cfg.PeerURL) })
		}
		listed[ep] = slices.ContainsFunc(members, func(m *pb.Member) bool { return slices.Contains(m.PeerURLs, cfg.PeerURL) })
		return members
	})
	cluster.SetJoinStartHook(t, func(string, int) error {
		mu.Lock()
		defer mu.Unlock()
		atStart = append(atStart, maps.Clone(listed))
		return nil
	})
	joined, err := cluster.Embed(context.Background(), cfg)
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	t.Cleanup(func() { _ = joined.Close(context.Background()) })
	if n := len(memberList(t, connect(t, ms[0]))); n != 4 || joined.Members() != 4 {
		t.Fatalf("after the join: %d members listed, the joined member sees %d; want 4", n, joined.Members())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 3 {
		t.Fatalf("the join asked %v for their members; want the 3 members", asked)
	}
	for ep, n := range asked {
		if n < 2 {
			t.Fatalf("the join asked %s %d times (%v); want again after its first answer lacked the joiner", ep, n, asked)
		}
	}
	if len(atStart) != 1 || len(atStart[0]) != 3 {
		t.Fatalf("starts, with what each member last listed: %v; want one start, after all 3 answered", atStart)
	}
	for ep, ok := range atStart[0] {
		if !ok {
			t.Fatalf("the member started while %s's last answer lacked it (%v)", ep, atStart[0])
		}
	}
}

// memberCountUnequal is the error etcd's start of a joining member returns
// when the member it asked for the membership had not applied the
// addition: etcd's own validation, wrapped as etcd's bootstrap wraps it.
func memberCountUnequal(t *testing.T) error {
	t.Helper()
	lg := zap.NewNop()
	peer := func(u string) types.URLs {
		urls, err := types.NewURLs([]string{u})
		if err != nil {
			t.Fatal(err)
		}
		return urls
	}
	old := membership.NewMember("m0", peer("http://127.0.0.1:1"), "", nil)
	existing := membership.NewClusterFromMembers(lg, 1, []*membership.Member{old})
	local := membership.NewClusterFromMembers(lg, 1, []*membership.Member{old, membership.NewMember("m3", peer("http://127.0.0.1:2"), "", nil)})
	err := membership.ValidateClusterAndAssignIDs(lg, local, existing)
	if err == nil {
		t.Fatal("etcd validated a local cluster of 2 members against an existing one of 1")
	}
	return fmt.Errorf("error validating peerURLs %s: %w", existing, err)
}

// TestJoinRetriesAStartALaggingMemberRefused: the start of a member joining
// a three-member cluster fails as when the member etcd asked had not
// applied the addition, after writing a member directory. The join starts
// again, that directory removed, up to cluster.JoinStartTries times; when
// every start fails it removes the member again. Another cause of failure
// is not retried.
func TestJoinRetriesAStartALaggingMemberRefused(t *testing.T) {
	ms := startCluster(t, 0, 0, 0)
	cli := connect(t, ms[0])
	before := memberList(t, cli)
	refused := memberCountUnequal(t)
	for _, c := range []struct {
		name      string
		fail      int   // starts that fail
		cause     error // with this error
		wantTries int
		joins     bool
	}{
		{"another cause", 1, errors.New("disk on fire"), 1, false},
		{"refused every time", cluster.JoinStartTries, refused, cluster.JoinStartTries, false},
		{"refused once", 1, refused, 2, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs etcdtest.LogBuffer
			cfg := joinConfig(t, ms, "m3", &logs)
			tries := 0
			cluster.SetJoinStartHook(t, func(dataDir string, try int) error {
				tries = try
				if try > c.fail {
					return nil
				}
				// What a refused start leaves: etcd wrote its member
				// directory before it asked the members.
				if _, err := os.Stat(filepath.Join(dataDir, "member")); !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("start %d found %s/member from the start before: %v", try, dataDir, err)
				}
				if err := os.MkdirAll(filepath.Join(dataDir, "member", "snap"), 0o700); err != nil {
					return err
				}
				return c.cause
			})
			s, err := cluster.Embed(context.Background(), cfg)
			if s != nil {
				t.Cleanup(func() { _ = s.Close(context.Background()) })
			}
			if tries != c.wantTries {
				t.Fatalf("%d starts; want %d (err %v)", tries, c.wantTries, err)
			}
			if got := strings.Count(logs.String(), "starting again"); got != c.wantTries-1 {
				t.Fatalf("log says %d times that it starts again, want %d: %s", got, c.wantTries-1, logs.String())
			}
			if !c.joins {
				var je *cluster.JoinError
				if !errors.As(err, &je) || !je.Removed || !strings.Contains(err.Error(), c.cause.Error()) {
					t.Fatalf("Embed() = %v; want a JoinError with the member removed again, whose cause is %v", err, c.cause)
				}
				if after := memberList(t, cli); !reflect.DeepEqual(after, before) {
					t.Fatalf("members after the failed join: %v, want those before it: %v", after, before)
				}
				if _, err := os.Stat(filepath.Join(cfg.DataDir, "member")); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("the failed join left %s/member: %v", cfg.DataDir, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("join: %v", err)
			}
			if n := len(memberList(t, cli)); n != 4 || s.Members() != 4 {
				t.Fatalf("after the join: %d members listed, the joined member sees %d; want 4", n, s.Members())
			}
		})
	}
}
