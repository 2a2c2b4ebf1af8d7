package queue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestStoppedWorkerTurnExpires: a worker process SIGSTOPped while its
// due mover holds a turn over a batch of due segments, its move not made
// (the turn and the batch's first due key still there a moment after the
// stop), and never continued, holds it only until the turn's lease ends:
// another worker then moves the batch, and every task runs once there,
// none before its time; the turn's lease is gone.
func TestStoppedWorkerTurnExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("a worker process, stopped")
	}
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	keys := keyspace.MustNew(ns)
	// 60 submissions of 10 tasks due over 3 s from 6 s on (the
	// submissions done by then on a loaded machine): hundreds of due
	// segments, moved in many moves, each under turns.
	const n = 600
	start := time.Now().Add(6 * time.Second)
	for r := range n / 10 {
		in := make([]queue.Task, 10)
		for i := range in {
			k := r*10 + i
			due := start.Add(time.Duration(k) * 5 * time.Millisecond)
			in[i] = queue.Task{ID: fmt.Sprintf("t%04d", k), Type: "x", RunAt: due, Parameters: []byte(strconv.FormatInt(due.UnixNano(), 10))}
		}
		if _, err := c.Submit(ctx, "jobs", in, nil); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	turns := cli.Watch(wctx, keys.QueueDueTurns("jobs"), clientv3.WithPrefix(), clientv3.WithFilterDelete())
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=due-block", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","), "H_NS="+ns)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	held, lease := stopHoldingTurn(t, cli, cmd, turns, keys.QueueDueTurns("jobs"), keys.QueueDue("jobs"))
	cancel()

	var mu sync.Mutex
	runs, early := map[string]int{}, 0
	all := make(chan struct{})
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 64})
	w.HandleAll(func(_ context.Context, tk *queue.Task) ([]byte, error) {
		due, _ := strconv.ParseInt(string(tk.Parameters), 10, 64)
		mu.Lock()
		defer mu.Unlock()
		if time.Now().UnixNano() < due {
			early++
		}
		if runs[tk.ID]++; len(runs) == n {
			close(all)
		}
		return nil, nil
	})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(rctx) }()
	select {
	case <-all:
	case <-time.After(2 * time.Minute): // a guard against hanging only
	}
	stop()
	<-done
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for _, r := range runs {
		if r > 1 {
			twice++
		}
	}
	if len(runs) != n || twice != 0 || early != 0 {
		t.Fatalf("%d of %d tasks ran on the other worker, %d twice, %d early; want all, once, none early", len(runs), n, twice, early)
	}
	// The stopped worker's turn ended by its lease, not by the worker.
	g, err := cli.Get(ctx, held)
	if err != nil || len(g.Kvs) != 0 {
		t.Fatalf("the stopped worker's turn %s is still there (%v)", held, err)
	}
	ttl, err := cli.TimeToLive(ctx, lease)
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) && (err != nil || ttl.TTL != -1) {
		t.Fatalf("the stopped worker's turn lease %x: %+v (%v), want it ended", lease, ttl, err)
	}
}

// stopHoldingTurn SIGSTOPs cmd as soon as the watch turns shows it took
// a turn under prefix, until a stop leaves it holding one whose move it
// did not make (the turn and its batch's first key under duePrefix still
// there stopPause after the stop, when a request the process sent has
// landed), and returns that turn's key and lease.
func stopHoldingTurn(t *testing.T, cli *clientv3.Client, cmd *exec.Cmd, turns clientv3.WatchChan, prefix, duePrefix string) (string, clientv3.LeaseID) {
	t.Helper()
	mine := fmt.Sprintf("/%d/", cmd.Process.Pid)
	timeout := time.After(time.Minute) // a guard against hanging only
	for tries := 0; tries < 200; {
		var wr clientv3.WatchResponse
		select {
		case wr = <-turns:
		case <-timeout:
			t.Fatalf("the worker took no turn that a stop caught in %d tries", tries)
		}
		if wr.Err() != nil {
			t.Fatal(wr.Err())
		}
		taken := false
		for _, ev := range wr.Events {
			taken = taken || strings.Contains(string(ev.Kv.Value), mine)
		}
		if !taken {
			continue
		}
		tries++
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(stopPause)
		g, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range g.Kvs {
			if !strings.Contains(string(kv.Value), mine) {
				continue
			}
			first := duePrefix + strings.TrimPrefix(string(kv.Key), prefix)
			d, err := cli.Get(context.Background(), first, clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			if d.Count == 1 {
				return string(kv.Key), clientv3.LeaseID(kv.Lease)
			}
		}
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("no stop caught the worker holding a turn")
	return "", 0
}

// stopPause is how long after a stop stopHoldingTurn looks at the turns:
// a request the process sent before it stopped has landed by then.
const stopPause = 200 * time.Millisecond
