package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"go.uber.org/goleak"
)

func TestEmbedConfigValidateCluster(t *testing.T) {
	t.Parallel()
	const (
		p1 = "http://127.0.0.1:21380"
		p2 = "http://127.0.0.1:22380"
		p3 = "http://127.0.0.1:23380"
	)
	ic := "s1=" + p1 + ",s2=" + p2 + ",s3=" + p3
	member := func(f func(*cluster.EmbedConfig)) cluster.EmbedConfig {
		c := cluster.EmbedConfig{Name: "s1", InitialCluster: ic, PeerURL: p1, ClientURL: "http://127.0.0.1:21379"}
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name  string
		cfg   cluster.EmbedConfig
		field string
		rule  string
	}{
		{"valid member", member(func(*cluster.EmbedConfig) {}), "", ""},
		{"valid join", cluster.EmbedConfig{Name: "s4", Join: []string{"http://127.0.0.1:21379"}, PeerURL: "http://127.0.0.1:24380", ClientURL: "http://127.0.0.1:24379"}, "", ""},
		{"valid on every address, advertised", member(func(c *cluster.EmbedConfig) {
			c.InitialCluster = "drover-0=http://drover-0.drover:2380,drover-1=http://drover-1.drover:2380,drover-2=http://drover-2.drover:2380"
			c.Name, c.PeerURL, c.ClientURL = "drover-0", "http://0.0.0.0:2380", "http://0.0.0.0:2379"
			c.AdvertisePeerURL, c.AdvertiseClientURL = "http://drover-0.drover:2380", "http://drover-0.drover:2379"
		}), "", ""},
		{"name not in the initial cluster", member(func(c *cluster.EmbedConfig) { c.Name = "s9" }), "Name", "one of the names in the initial cluster (s1, s2, s3)"},
		{"peer URL differs from the initial cluster's", member(func(c *cluster.EmbedConfig) { c.PeerURL = "http://127.0.0.1:29380" }), "PeerURL", "s1's peer URL in the initial cluster, " + p1},
		{"advertised peer URL differs", member(func(c *cluster.EmbedConfig) { c.AdvertisePeerURL = p2 }), "AdvertisePeerURL", "s1's peer URL in the initial cluster"},
		{"entry without =", member(func(c *cluster.EmbedConfig) { c.InitialCluster = "s1=" + p1 + ",s2" }), "InitialCluster", `entry "s2" must be NAME=PEER-URL`},
		{"name twice", member(func(c *cluster.EmbedConfig) { c.InitialCluster = "s1=" + p1 + ",s1=" + p2 }), "InitialCluster", "name s1 appears twice"},
		{"URL twice", member(func(c *cluster.EmbedConfig) { c.InitialCluster = "s1=" + p1 + ",s2=" + p1 }), "InitialCluster", "same peer URL"},
		{"peer URL with a path", member(func(c *cluster.EmbedConfig) { c.InitialCluster = "s1=" + p1 + ",s2=http://h:1/x" }), "InitialCluster", "HOST:PORT with no path"},
		{"bad state", member(func(c *cluster.EmbedConfig) { c.InitialClusterState = "old" }), "InitialClusterState", "new or existing"},
		{"existing alone", cluster.EmbedConfig{InitialClusterState: "existing"}, "InitialClusterState", "existing needs"},
		{"join and initial cluster", cluster.EmbedConfig{Name: "s1", Join: []string{"http://127.0.0.1:1"}, InitialCluster: ic, PeerURL: p1}, "InitialCluster", "must be empty when joining"},
		{"single member peers beyond loopback", cluster.EmbedConfig{PeerURL: "http://0.0.0.0:2380"}, "PeerURL", "LOOPBACK"},
		{"every address, not advertised", member(func(c *cluster.EmbedConfig) {
			c.ClientURL = "http://0.0.0.0:21379"
		}), "AdvertiseClientURL", "required when the listener binds every address"},
		{"advertised 0.0.0.0", member(func(c *cluster.EmbedConfig) { c.AdvertiseClientURL = "http://0.0.0.0:21379" }), "AdvertiseClientURL", "not 0.0.0.0"},
		{"bad name", cluster.EmbedConfig{Name: "a b"}, "Name", "letters, digits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != tc.field || !strings.Contains(ie.Rule, tc.rule) {
				t.Fatalf("Validate() = %v, want an InputError on %s saying %q", err, tc.field, tc.rule)
			}
		})
	}
}

// startCluster starts n in-process members on free loopback ports, all at
// once (each waits for a quorum), with quotas[i] as member i's database
// quota (0: the default), and closes them when the test ends.
func startCluster(t *testing.T, quotas ...int64) []*cluster.Server {
	t.Helper()
	n := len(quotas)
	cfgs := make([]cluster.EmbedConfig, n)
	var pairs []string
	for i := range cfgs {
		cfgs[i] = cluster.EmbedConfig{
			Name:              fmt.Sprintf("m%d", i),
			DataDir:           t.TempDir(),
			ClientURL:         "http://" + etcdtest.FreeAddr(),
			PeerURL:           "http://" + etcdtest.FreeAddr(),
			UnsafeNoFsync:     true,
			QuotaBackendBytes: quotas[i],
			DefragInterval:    -1,
			StartTimeout:      30 * time.Second,
		}
		pairs = append(pairs, cfgs[i].Name+"="+cfgs[i].PeerURL)
	}
	servers := make([]*cluster.Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range cfgs {
		cfgs[i].InitialCluster = strings.Join(pairs, ",")
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			servers[i], errs[i] = cluster.Embed(context.Background(), cfgs[i])
		}(i)
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, s := range servers {
			if s != nil {
				_ = s.Close(context.Background())
			}
		}
		// The leader polls the other members' versions over keep-alive
		// HTTP; a connection between two members of one process ends
		// only at etcd's peer read timeout (5 s) after they close, and
		// the package's leak check would take it for a leak.
		etcdtest.Eventually(10*time.Second, func() bool { return goleak.Find(etcdtest.LeakOptions()...) == nil })
	})
	for i := range servers {
		if errs[i] != nil {
			t.Fatalf("member %d: %v", i, errs[i])
		}
	}
	return servers
}
