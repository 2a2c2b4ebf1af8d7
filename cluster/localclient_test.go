package cluster_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLocalClientWatchRequiresLeader: on a member that lost its leader (the
// other of two members stopped), a watch of its in-process client that
// requires a leader ends within a few election timeouts, as a gRPC client's
// does, and a new one is refused at once; a watch that does not require
// one stays open. Reads and writes on a member that has one go through.
func TestLocalClientWatchRequiresLeader(t *testing.T) {
	servers := startCluster(t, 1<<30, 1<<30)
	cli := servers[0].LocalClient()
	defer cli.Close()
	ns := etcdtest.Namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := cli.Put(ctx, "/"+ns+"/k", "v"); err != nil {
		t.Fatal(err)
	}
	if r, err := cli.Get(ctx, "/"+ns+"/k"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get: %v %v", r, err)
	}
	needs := cli.Watch(clientv3.WithRequireLeader(ctx), "/"+ns+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	plain := cli.Watch(ctx, "/"+ns+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	for _, ch := range []clientv3.WatchChan{needs, plain} {
		if wr := <-ch; !wr.Created {
			t.Fatalf("first answer of a watch: %+v", wr)
		}
	}
	// An event goes through the leader-watching watch.
	if _, err := cli.Put(ctx, "/"+ns+"/k2", "v"); err != nil {
		t.Fatal(err)
	}
	if wr := <-needs; len(wr.Events) != 1 {
		t.Fatalf("event: %+v", wr)
	}
	<-plain

	_ = servers[1].Close(context.Background()) // no quorum: member 0 loses its leader
	start := time.Now()
	timeout := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case _, ok := <-needs:
			done = !ok
		case <-timeout:
			t.Fatal("the watch that requires a leader is still open 30 s after the member lost it")
		}
	}
	t.Logf("the watch that requires a leader ended %s after the other member stopped", time.Since(start).Round(time.Millisecond))
	select {
	case _, ok := <-plain:
		if !ok {
			t.Fatal("the watch that does not require a leader ended too")
		}
	default:
	}
	refused := cli.Watch(clientv3.WithRequireLeader(ctx), "/"+ns+"/", clientv3.WithPrefix())
	select {
	case _, ok := <-refused:
		if ok {
			t.Fatal("a watch that requires a leader, opened without one, answered")
		}
	case <-time.After(time.Second):
		t.Fatal("a watch that requires a leader, opened without one, was not refused at once")
	}
}

// TestLocalClientWatchCancelStorm: many watches of the in-process client
// cancelled at once while events flow to them (each waiter of a queue's
// task cancels its watches when the first fires) leave the client able to
// watch: a new watch sees the next put. etcd's in-process transport joins
// client and server by unbuffered channels, and a storm of cancels on one
// shared stream deadlocked them (etcd issues 18879 and 20716).
func TestLocalClientWatchCancelStorm(t *testing.T) {
	s, _ := etcdtest.StartOwn(t)
	cli := s.LocalClient(t)
	ns := "/" + etcdtest.Namespace(t) + "/"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stopPuts := make(chan struct{})
	puts := make(chan error, 1)
	go func() { // events for every watch, until the storm is over
		for i := 0; ; i++ {
			select {
			case <-stopPuts:
				puts <- nil
				return
			default:
			}
			if _, err := cli.Put(ctx, fmt.Sprintf("%sk%d", ns, i%50), strings.Repeat("x", 512)); err != nil {
				puts <- err
				return
			}
		}
	}()
	const rounds, watches = 20, 100
	for r := range rounds {
		var wg sync.WaitGroup
		for range watches {
			wg.Add(1)
			go func() {
				defer wg.Done()
				wctx, stop := context.WithCancel(ctx)
				defer stop()
				ch := cli.Watch(wctx, ns, clientv3.WithPrefix())
				<-ch // the first answer; then the watch is cancelled unread
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatalf("round %d: %d watches not answered within 60 s of their start: the in-process watch stream is stuck", r, watches)
		}
	}
	close(stopPuts)
	if err := <-puts; err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	ch := cli.Watch(wctx, ns+"after", clientv3.WithCreatedNotify())
	if wr := <-ch; !wr.Created {
		t.Fatalf("a watch after the storm was not created: %+v (%v)", wr, wr.Err())
	}
	if _, err := cli.Put(ctx, ns+"after", "v"); err != nil {
		t.Fatal(err)
	}
	if wr := <-ch; len(wr.Events) != 1 {
		t.Fatalf("a watch after the storm got %+v (%v), want the put", wr, wr.Err())
	}
}

// TestLocalClientCloseEndsUnreadWatches: Close of the in-process client
// ends the goroutines of its watches, including one whose consumer stopped
// reading while an answer waited for it (its context never cancelled), and
// a watch opened after Close answers nothing: its channel is closed.
func TestLocalClientCloseEndsUnreadWatches(t *testing.T) {
	s, _ := etcdtest.StartOwn(t)
	cli := s.Server.LocalClient()
	ns := "/" + etcdtest.Namespace(t) + "/"
	ctx := context.Background()
	const watches = 8
	for range watches {
		// Created notify: an answer is ready for the consumer, which never reads it.
		_ = cli.Watch(ctx, ns, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	}
	if _, err := cli.Put(ctx, ns+"k", "v"); err != nil {
		t.Fatal(err)
	}
	forwarders := func() int {
		buf := make([]byte, 1<<22)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "(*streamPerWatch).Watch.func")
	}
	deadline := time.Now().Add(30 * time.Second)
	for forwarders() < watches && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := forwarders(); n < watches {
		t.Fatalf("%d watch goroutines before Close, want %d", n, watches)
	}
	_ = cli.Close() // v3client's Close answers its context's end: context canceled
	deadline = time.Now().Add(30 * time.Second)
	for forwarders() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := forwarders(); n > 0 {
		t.Fatalf("%d watch goroutines remain 30 s after Close: their consumers stopped reading", n)
	}
	select {
	case _, ok := <-cli.Watch(ctx, ns):
		if ok {
			t.Fatal("a watch opened after Close answered")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a watch opened after Close is not closed")
	}
}
