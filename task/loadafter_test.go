package task_test

import (
	"context"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
)

// A checkpoint read for a claim made at a revision reads what was written
// before it, whether the member's own state is past the revision (read
// without a read index round) or not yet (read again linearizably); with
// no revision, as Load.
func TestLoadAfterClaimRevision(t *testing.T) {
	s, err := etcdtest.Start(etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	cli := s.Client(t)
	ctx := context.Background()
	store, _ := task.NewStore(cli, "la")
	put, err := cli.Put(ctx, keyspace.MustNew("la").TaskCheckpoint("job-1"), `{"task_id":"job-1","step":2,"steps":3,"completed":false,"state":"eyJ4IjoxfQ==","at":"2026-11-29T00:00:00Z"}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, after := range []int64{0, put.Header.Revision, put.Header.Revision + 1000} {
		cp, err := store.LoadAfter(ctx, "job-1", after)
		if err != nil || cp.Step != 2 || string(cp.State) != `{"x":1}` {
			t.Fatalf("after revision %d: %+v, %v; want step 2 with its state", after, cp, err)
		}
	}
}
