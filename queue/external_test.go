package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// grantLease grants a lease of ttl that the test closes (revokes) at its end.
func grantLease(t *testing.T, cli *clientv3.Client, ttl time.Duration) *lease.Lease {
	t.Helper()
	l, err := lease.Grant(context.Background(), cli, ttl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func submitN(t *testing.T, c *queue.Client, q string, n int, edit func(*queue.Task)) {
	t.Helper()
	tasks := make([]queue.Task, n)
	for i := range tasks {
		tasks[i] = queue.Task{ID: fmt.Sprintf("%s-%d", q, i), Type: "x"}
		if edit != nil {
			edit(&tasks[i])
		}
	}
	if res, err := c.Submit(context.Background(), q, tasks, nil); err != nil || res.Submitted != n {
		t.Fatalf("submit: %+v %v", res, err)
	}
}

func held(q string, t *queue.Task, l *lease.Lease) queue.Held {
	return queue.Held{Queue: q, ID: t.ID, Token: t.Token, Lease: l.ID()}
}

// TestExternalOutcomes: an external worker claims tasks of a segment under
// its lease and reports each: ack (SUCCEEDED with its result), a transient
// failure (RETRYING), a permanent one (DEAD); a second outcome for the same
// claim, or a heartbeat after it, is fenced out, and so is a claim named
// with another lease.
func TestExternalOutcomes(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	submitN(t, c, "ext", 3, nil)
	l := grantLease(t, cli, 10*time.Second)
	tasks, err := c.Claim(ctx, "ext", queue.ClaimRequest{Lease: l, Worker: "w1", Max: 5})
	if err != nil || len(tasks) != 3 {
		t.Fatalf("claimed %d tasks, err %v", len(tasks), err)
	}
	for _, tk := range tasks {
		if tk.Attempt != 1 || tk.Token == 0 || tk.CurrentStatus != queue.Running {
			t.Fatalf("claimed %+v", tk)
		}
		if _, err := c.Heartbeat(ctx, held("ext", tk, l)); err != nil {
			t.Fatal(err)
		}
	}
	other := queue.Held{Queue: "ext", ID: tasks[0].ID, Token: tasks[0].Token, Lease: l.ID() + 1}
	if _, err := c.Ack(ctx, other, nil); !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("ack under another lease: %v", err)
	}
	if _, err := c.Ack(ctx, held("ext", tasks[0], l), []byte(`{"ok":1}`)); err != nil {
		t.Fatal(err)
	}
	if tk, err := c.Fail(ctx, held("ext", tasks[1], l), "flaky", false); err != nil || tk.CurrentStatus != queue.Retrying {
		t.Fatalf("transient failure: %+v %v", tk, err)
	}
	if tk, err := c.Fail(ctx, held("ext", tasks[2], l), "broken input", true); err != nil || tk.CurrentStatus != queue.Dead {
		t.Fatalf("permanent failure: %+v %v", tk, err)
	}
	for _, tk := range tasks {
		if _, err := c.Ack(ctx, held("ext", tk, l), nil); !errors.Is(err, lease.ErrFenced) {
			t.Fatalf("second outcome of %s: %v", tk.ID, err)
		}
		if _, err := c.Heartbeat(ctx, held("ext", tk, l)); !errors.Is(err, lease.ErrFenced) {
			t.Fatalf("heartbeat after the outcome of %s: %v", tk.ID, err)
		}
	}
	want := map[string]queue.Status{tasks[0].ID: queue.Succeeded, tasks[1].ID: queue.Retrying, tasks[2].ID: queue.Dead}
	for id, st := range want {
		got, err := c.Get(ctx, id)
		if err != nil || got.CurrentStatus != st {
			t.Fatalf("%s: %+v %v, want %s", id, got, err, st)
		}
		if st == queue.Succeeded && string(got.Result) != `{"ok":1}` {
			t.Fatalf("result %q", got.Result)
		}
		if st != queue.Succeeded && got.LastError == "" {
			t.Fatalf("%s without its error", id)
		}
	}
	if _, err := c.Ack(ctx, queue.Held{Queue: "ext", ID: "nope", Token: 5}, nil); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("ack of no task: %v", err)
	}
}

// TestExternalRetryAndRecordClaim: a task that failed transiently is moved
// back to pending by the next claim once due (no Worker runs), claimed from
// its record with its attempt counted, and acked.
func TestExternalRetryAndRecordClaim(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	l, first := failedOnce(t, c, cli, "retry")
	second, err := c.Claim(ctx, "retry", queue.ClaimRequest{Lease: l, Worker: "w", Wait: 5 * time.Second})
	if err != nil || len(second) != 1 || second[0].Attempt != 2 || second[0].Token == first[0].Token {
		t.Fatalf("second claim: %+v %v", second, err)
	}
	if _, err := c.Ack(ctx, held("retry", first[0], l), nil); !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("ack with the first attempt's token: %v", err)
	}
	if _, err := c.Ack(ctx, held("retry", second[0], l), []byte("done")); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, second[0].ID)
	if err != nil || got.CurrentStatus != queue.Succeeded || got.RetriesAttempted != 1 {
		t.Fatalf("%+v %v", got, err)
	}
}

// TestExternalLeaseLoss: the claims of a lease that ends are claimable by
// another lease at once, attempt 2, and the first holder's ack is fenced.
func TestExternalLeaseLoss(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	submitN(t, c, "loss", 2, nil)
	l1 := grantLease(t, cli, 10*time.Second)
	lost, err := c.Claim(ctx, "loss", queue.ClaimRequest{Lease: l1, Worker: "w1", Max: 2})
	if err != nil || len(lost) != 2 {
		t.Fatalf("%v %v", lost, err)
	}
	if _, err := cli.Revoke(ctx, l1.ID()); err != nil {
		t.Fatal(err)
	}
	l2 := grantLease(t, cli, 10*time.Second)
	again, err := c.Claim(ctx, "loss", queue.ClaimRequest{Lease: l2, Worker: "w2", Max: 2, Wait: 2 * time.Second})
	if err != nil || len(again) != 2 {
		t.Fatalf("%v %v", again, err)
	}
	for i := range again {
		if again[i].Attempt != 2 {
			t.Fatalf("attempt %d, want 2", again[i].Attempt)
		}
		if _, err := c.Ack(ctx, held("loss", lost[i], l1), nil); !errors.Is(err, lease.ErrFenced) {
			t.Fatalf("late ack: %v", err)
		}
	}
	for _, tk := range again {
		if _, err := c.Ack(ctx, held("loss", tk, l2), nil); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.Stats(ctx, "loss")
	if err != nil || st.Succeeded != 2 || st.Unfinished() != 0 {
		t.Fatalf("%+v %v", st, err)
	}
}

// TestExternalClaimOnce: claimers racing for 60 tasks, acking what they
// get, claim each exactly once.
func TestExternalClaimOnce(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	submitN(t, c, "race", 60, nil)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			l := grantLease(t, cli, 10*time.Second)
			for {
				tasks, err := c.Claim(ctx, "race", queue.ClaimRequest{Lease: l, Worker: fmt.Sprint("w", i), Max: 7})
				if err != nil {
					t.Error(err)
					return
				}
				if len(tasks) == 0 {
					return
				}
				for _, tk := range tasks {
					mu.Lock()
					seen[tk.ID]++
					mu.Unlock()
					if _, err := c.Ack(ctx, held("race", tk, l), nil); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	if len(seen) != 60 {
		t.Fatalf("claimed %d distinct tasks, want 60", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("%s claimed %d times", id, n)
		}
	}
	st, err := c.Stats(ctx, "race")
	if err != nil || st.Succeeded != 60 || st.Unfinished() != 0 {
		t.Fatalf("%+v %v", st, err)
	}
}

// TestExternalRelease: a task handed back is claimable at once with the
// same attempt, the released claim's ack is fenced, and the run's other
// tasks are unaffected.
func TestExternalRelease(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	submitN(t, c, "rel", 3, nil)
	l1 := grantLease(t, cli, 10*time.Second)
	got, err := c.Claim(ctx, "rel", queue.ClaimRequest{Lease: l1, Worker: "w1", Max: 3})
	if err != nil || len(got) != 3 {
		t.Fatalf("%v %v", got, err)
	}
	back, err := c.Release(ctx, held("rel", got[0], l1))
	if err != nil || back.CurrentStatus != queue.Pending {
		t.Fatalf("release: %+v %v", back, err)
	}
	if _, err := c.Release(ctx, held("rel", got[0], l1)); !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("second release: %v", err)
	}
	if _, err := c.Ack(ctx, held("rel", got[0], l1), nil); !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("ack of the released claim: %v", err)
	}
	l2 := grantLease(t, cli, 10*time.Second)
	again, err := c.Claim(ctx, "rel", queue.ClaimRequest{Lease: l2, Worker: "w2", Max: 3})
	if err != nil || len(again) != 1 || again[0].ID != got[0].ID || again[0].Attempt != got[0].Attempt {
		t.Fatalf("claimed again: %v %v (released %s attempt %d)", again, err, got[0].ID, got[0].Attempt)
	}
	for _, h := range []queue.Held{held("rel", got[1], l1), held("rel", got[2], l1), held("rel", again[0], l2)} {
		if _, err := c.Ack(ctx, h, nil); err != nil {
			t.Fatalf("ack %s: %v", h.ID, err)
		}
	}
	st, err := c.Stats(ctx, "rel")
	if err != nil || st.Succeeded != 3 || st.Unfinished() != 0 {
		t.Fatalf("%+v %v", st, err)
	}
}

// TestExternalReleaseRecordTask: a task with a record of its own (it failed
// once) handed back is PENDING as Release returns it and as read, claimed
// again with the same attempt, and the released claim's ack is fenced.
func TestExternalReleaseRecordTask(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	l, _ := failedOnce(t, c, cli, "relrec")
	second, err := c.Claim(ctx, "relrec", queue.ClaimRequest{Lease: l, Worker: "w", Wait: 5 * time.Second})
	if err != nil || len(second) != 1 || second[0].Attempt != 2 {
		t.Fatalf("second claim: %+v %v", second, err)
	}
	back, err := c.Release(ctx, held("relrec", second[0], l))
	if err != nil || back.CurrentStatus != queue.Pending || back.Attempt != 1 || back.Token != 0 {
		t.Fatalf("release: %+v %v", back, err)
	}
	if got, err := c.Get(ctx, second[0].ID); err != nil || got.CurrentStatus != queue.Pending {
		t.Fatalf("read after the release: %+v %v", got, err)
	}
	if _, err := c.Ack(ctx, held("relrec", second[0], l), nil); !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("ack of the released claim: %v", err)
	}
	third, err := c.Claim(ctx, "relrec", queue.ClaimRequest{Lease: l, Worker: "w", Wait: 5 * time.Second})
	if err != nil || len(third) != 1 || third[0].Attempt != 2 {
		t.Fatalf("claimed again: %+v %v (want attempt 2 again)", third, err)
	}
	if _, err := c.Ack(ctx, held("relrec", third[0], l), nil); err != nil {
		t.Fatal(err)
	}
}

// failedOnce submits one task to q with a 1-50 ms backoff, claims it under
// a new lease and fails it transiently: it is RETRYING, with a record of
// its own. It returns the lease and the first claim.
func failedOnce(t *testing.T, c *queue.Client, cli *clientv3.Client, q string) (*lease.Lease, []*queue.Task) {
	t.Helper()
	submitN(t, c, q, 1, func(tk *queue.Task) {
		tk.BackoffBase, tk.BackoffMax = queue.Duration(time.Millisecond), queue.Duration(50*time.Millisecond)
	})
	l := grantLease(t, cli, 10*time.Second)
	first, err := c.Claim(context.Background(), q, queue.ClaimRequest{Lease: l, Worker: "w"})
	if err != nil || len(first) != 1 {
		t.Fatalf("%v %v", first, err)
	}
	if _, err := c.Fail(context.Background(), held(q, first[0], l), "again", false); err != nil {
		t.Fatal(err)
	}
	return l, first
}

// TestExternalClaimWokenByALostRun: a claim that waits while the only
// task runs (its segment then looks busy) gets the task at once when the
// holder's lease ends: the run's DELETE wakes it and clears the busy mark,
// rather than the claim skipping the segment until the mark expires or its
// wait ends.
func TestExternalClaimWokenByALostRun(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	submitN(t, c, "woken", 1, nil)
	l1 := grantLease(t, cli, 10*time.Second)
	if got, err := c.Claim(ctx, "woken", queue.ClaimRequest{Lease: l1, Worker: "w1", Max: 1}); err != nil || len(got) != 1 {
		t.Fatalf("%v %v", got, err)
	}
	l2 := grantLease(t, cli, 10*time.Second)
	type result struct {
		tasks []*queue.Task
		err   error
		at    time.Time
	}
	done := make(chan result, 1)
	go func() {
		got, err := c.Claim(ctx, "woken", queue.ClaimRequest{Lease: l2, Worker: "w2", Max: 1, Wait: 8 * time.Second})
		done <- result{got, err, time.Now()}
	}()
	time.Sleep(300 * time.Millisecond) // the claim found the segment's slot running and waits
	revoked := time.Now()
	if _, err := cli.Revoke(ctx, l1.ID()); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.tasks) != 1 || r.tasks[0].Attempt != 2 {
		t.Fatalf("the waiting claim: %v %v", r.tasks, r.err)
	}
	if lag := r.at.Sub(revoked); lag > time.Second {
		t.Fatalf("the waiting claim got the task %v after the holder's lease ended, want within 1 s", lag)
	}
}

// TestExternalClaimsInLineWokenByLostRuns: two claims of one task each
// wait while another session holds both tasks of the queue's only segment;
// one of them leads the line of waiting claims, the other waits behind it.
// When the holder's lease ends, both tasks are claimable again: the leader
// takes one, and the claim behind it, which had marked the segment busy
// before it lined up and saw none of the runs' deletions itself, takes the
// other within a second, not when its busy mark or its wait runs out.
func TestExternalClaimsInLineWokenByLostRuns(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	submitN(t, c, "lined", 2, nil)
	l1 := grantLease(t, cli, 10*time.Second)
	if got, err := c.Claim(ctx, "lined", queue.ClaimRequest{Lease: l1, Worker: "w1", Max: 2}); err != nil || len(got) != 2 {
		t.Fatalf("%v %v", got, err)
	}
	type result struct {
		tasks []*queue.Task
		err   error
		at    time.Time
	}
	done := make(chan result, 2)
	for i := 0; i < 2; i++ {
		l := grantLease(t, cli, 10*time.Second)
		go func() {
			got, err := c.Claim(ctx, "lined", queue.ClaimRequest{Lease: l, Worker: fmt.Sprint("w", i+2), Max: 1, Wait: 8 * time.Second})
			done <- result{got, err, time.Now()}
		}()
	}
	time.Sleep(300 * time.Millisecond) // both found the segment's slots running and wait
	revoked := time.Now()
	if _, err := cli.Revoke(ctx, l1.ID()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		r := <-done
		if r.err != nil || len(r.tasks) != 1 || r.tasks[0].Attempt != 2 {
			t.Fatalf("a waiting claim: %v %v", r.tasks, r.err)
		}
		if lag := r.at.Sub(revoked); lag > time.Second {
			t.Fatalf("a waiting claim got its task %v after the holder's lease ended, want within 1 s", lag)
		}
	}
}
