package queue_test

import (
	"context"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The waits' tests pass with wait keys written in their short form: a
// park stores a short value (not the JSON form), a signal wakes the task,
// a timeout moves it back to pending, a cancel and a purge remove its
// key, and signals racing the park are never missed.
func TestWaitsWithShortWaitValues(t *testing.T) {
	defer queue.SetShortWaitValues(true)()
	t.Run("stored short", testWaitValueStoredShort)
	t.Run("wake", TestWaitSignalWakesParkedTask)
	t.Run("timeout", TestWaitTimesOut)
	t.Run("cancel and purge", TestWaitCancelAndPurge)
	t.Run("race", TestWaitSignalRacesThePark)
}

// testWaitValueStoredShort parks a task and reads its wait key: its value
// is the short form, which does not start with '{' as the JSON form does.
func testWaitValueStoredShort(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitOne(t, c, "agent-1")
	startSleepWorker(t, cli, ns, newStillClock(), newSignalLog().steps(3, 0, nil, 0))
	ctx := context.Background()
	var g *clientv3.GetResponse
	waitUntil(t, "the task to park", func() bool {
		var err error
		g, err = cli.Get(ctx, keyspace.MustNew(ns).QueueWait("q"), clientv3.WithPrefix())
		return err == nil && len(g.Kvs) == 1
	})
	if v := g.Kvs[0].Value; len(v) == 0 || v[0] == '{' {
		t.Fatalf("wait key value %q; want the short form", v)
	}
}
