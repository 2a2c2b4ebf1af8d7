package checkpoint_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock"
)

func TestAdmission(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx := context.Background()
	admitter := func() *checkpoint.Admitter {
		locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = locker.Close(ctx) })
		a, err := checkpoint.NewAdmitter(cli, ns, locker)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a, b, c := admitter(), admitter(), admitter()

	first, err := a.Admit(ctx, "th", checkpoint.Enqueue)
	if err != nil {
		t.Fatal(err)
	}
	// reject: fails fast while the thread is held.
	if _, err := b.Admit(ctx, "th", checkpoint.Reject); !errors.Is(err, checkpoint.ErrBusy) {
		t.Fatalf("reject: %v, want ErrBusy", err)
	}
	// enqueue: waits its turn, and gets it when the first run ends.
	got := make(chan *checkpoint.Run, 1)
	go func() {
		r, err := b.Admit(ctx, "th", checkpoint.Enqueue)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	select {
	case <-got:
		t.Fatal("an enqueued run started while the thread was held")
	case <-time.After(200 * time.Millisecond):
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if second == nil || second.Context().Err() != nil {
		t.Fatal("the enqueued run did not start")
	}
	// interrupt: the running one's context ends with ErrInterrupted, and
	// the new run takes over once it released the thread.
	go func() {
		<-second.Context().Done()
		_ = second.Release(ctx)
	}()
	third, err := c.Admit(ctx, "th", checkpoint.Interrupt)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(second.Context()), checkpoint.ErrInterrupted) {
		t.Fatalf("interrupted run's cause: %v", context.Cause(second.Context()))
	}
	if third.Context().Err() != nil || third.Lock.Token() <= second.Lock.Token() {
		t.Fatalf("the interrupting run: err %v, token %d after %d", third.Context().Err(), third.Lock.Token(), second.Lock.Token())
	}
	if err := third.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Admit(ctx, "th", checkpoint.Admission("maybe")); err == nil {
		t.Fatal("unknown policy accepted")
	}
}
