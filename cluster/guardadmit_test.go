package cluster_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/storeguard"
)

// burstBatch is a batch of 10 tasks of batch b, each with 45 KB of random
// text in its parameters (submissions are compressed: the text must not
// compress away).
func burstBatch(rng *rand.ChaCha8, b int) []queue.Task {
	raw := make([]byte, 45_000*3/4)
	ts := make([]queue.Task, 10)
	for i := range ts {
		_, _ = rng.Read(raw)
		ts[i] = queue.Task{ID: fmt.Sprintf("burst-%03d-%02d", b, i), Type: "fill",
			Parameters: []byte(`{"blob":"` + base64.RawStdEncoding.EncodeToString(raw) + `"}`)}
	}
	return ts
}

// TestGuardAdmitsBurst: a 16 MiB store measured once by its guard (whose
// clock never ticks), then 6 submitters at once send 42 batches of 10
// tasks of 45 KB of text (about 340 KB a batch once compressed: 14 MiB)
// through a client whose KV admits (storeguard.NewKV), with no check in
// between: every batch goes in or is refused with a StoreFullError. A
// batch may have been refused only because writes finished less than
// Settle before were not measured yet: measured, it may fit. So further
// batches are sent one at a time, each followed by a check, until a check
// sets the guard key (a refused batch still does not fit once measured
// again, or the store is past the mark): at most 40, which fill more
// than the quota. Then the database is near the high-water mark (70 %),
// etcd has raised no NOSPACE alarm, a lease is still granted, and a
// submission is refused.
func TestGuardAdmitsBurst(t *testing.T) {
	t.Parallel()
	srv, raw := etcdtest.QuotaServer(t, 16<<20)
	// A bound against a hang, not a measure: 14 MiB through a loaded
	// machine's fsyncs took past a minute once (CI, load 10).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	adm := storeguard.NewAdmission(nil)
	ns := etcdtest.Namespace(t)
	never := func(time.Duration) <-chan time.Time { return nil }
	g := etcdtest.NewGuard(t, raw, cluster.GuardConfig{Endpoint: srv.Endpoints()[0], Namespaces: []string{ns}, Admission: adm,
		After: never, Logger: slog.New(slog.DiscardHandler)})
	if _, err := g.Check(ctx); err != nil {
		t.Fatal(err)
	}
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cli.KV = storeguard.NewKV(cli.KV, adm)
	q, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.NewChaCha8([32]byte{3, 6})
	batches := make([][]queue.Task, 42)
	for b := range batches {
		batches[b] = burstBatch(rng, b)
	}
	var mu sync.Mutex
	in, refused := 0, 0
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := w; b < len(batches); b += 6 {
				_, err := q.Submit(ctx, "burst", batches[b], nil)
				mu.Lock()
				switch {
				case err == nil:
					in++
				case errors.Is(err, drover.ErrStoreFull):
					refused++
				default:
					t.Errorf("batch %d: %v, want nil or ErrStoreFull", b, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if refused == 0 || in == 0 {
		t.Fatalf("%d in, %d refused: want both", in, refused)
	}
	st, err := g.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	extra := 0
	for ; !st.Full; extra++ {
		if extra == 40 {
			t.Fatalf("40 more batches, each followed by a check, and the guard key is not set: %+v", st)
		}
		if _, err := q.Submit(ctx, "burst", burstBatch(rng, 100+extra), nil); err != nil && !errors.Is(err, drover.ErrStoreFull) {
			t.Fatalf("batch %d after the burst: %v, want nil or ErrStoreFull", 100+extra, err)
		}
		if st, err = g.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("burst: %d batches in, %d refused; %d more until the key was set; %.1f MiB of 16 in the database (%.1f in use)",
		in, refused, extra, float64(st.Size)/(1<<20), float64(st.InUse)/(1<<20))
	// Cost's estimate errs on the high side; a little past the mark would
	// still be far from the quota.
	if near := int64(16<<20) * 75 / 100; st.Size > near {
		t.Fatalf("the database grew to %d bytes, past 75 %% of the quota (%d)", st.Size, near)
	}
	if al, err := raw.AlarmList(ctx); err != nil || len(al.Alarms) != 0 {
		t.Fatalf("alarms after the burst: %v, %v", al, err)
	}
	if _, err := raw.Grant(ctx, 5); err != nil {
		t.Fatalf("lease grant after the burst: %v", err)
	}
	if _, err := q.Submit(ctx, "burst", burstBatch(rng, 199), nil); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("submission once the key is set: %v", err)
	}
}
