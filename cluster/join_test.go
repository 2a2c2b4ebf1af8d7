package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
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
