package stream_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keyClaim is a claim held as an etcd key bound to a lease, as a queue
// task's claim is: its token is the key's create revision.
type keyClaim struct {
	key   string
	token int64
	lease clientv3.LeaseID
}

func (k *keyClaim) Token() int64 { return k.token }
func (k *keyClaim) Compares() []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k.key), "=", k.token)}
}
func (k *keyClaim) Err() error { return nil }

// claimKey takes the claim key of task id with a lease of its own (the
// key must be free).
func claimKey(t *testing.T, cli *clientv3.Client, keys keyspace.Space, id string) *keyClaim {
	t.Helper()
	ctx := context.Background()
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	key := keys.Root() + "claims/" + id
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, "", clientv3.WithLease(l.ID))).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("claim %s: %v (taken: %v)", id, err, err == nil)
	}
	return &keyClaim{key: key, token: resp.Header.Revision, lease: l.ID}
}

// lose ends claim k as a worker's death past its TTL would.
func lose(t *testing.T, cli *clientv3.Client, k *keyClaim) {
	t.Helper()
	if _, err := cli.Revoke(context.Background(), k.lease); err != nil {
		t.Fatal(err)
	}
}

// env is one test's client, namespace, writer and hub.
type env struct {
	cli  *clientv3.Client
	keys keyspace.Space
	w    *stream.Writer
	hub  *stream.Hub
}

func newEnv(t *testing.T, lim stream.Limits) env {
	t.Helper()
	cli := srv.Client(t)
	keys := keyspace.MustNew(etcdtest.Namespace(t))
	return env{cli: cli, keys: keys, w: stream.NewWriter(cli, keys, lim, time.Millisecond), hub: stream.NewHub(cli, keys)}
}

// collect follows task id's stream from from until Done or n events.
func collect(t *testing.T, h *stream.Hub, id string, from int64, n int) []stream.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []stream.Event
	for ev, err := range h.Follow(ctx, id, from) {
		if err != nil {
			t.Fatalf("follow %s: %v", id, err)
		}
		out = append(out, ev)
		if len(out) == n {
			break
		}
	}
	return out
}
