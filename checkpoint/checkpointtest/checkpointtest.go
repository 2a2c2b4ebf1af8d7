package checkpointtest

import (
	"context"
	"testing"

	"github.com/droverhq/drover/checkpoint"
)

// NewStore makes a store of the implementation under test, empty and of
// the test's own (a namespace, a schema), closed when t ends.
type NewStore func(t *testing.T) checkpoint.Store

// Options tunes the suite to a store.
type Options struct {
	// MaxState is the largest state the store takes (checkpoint.MaxState
	// for etcd); zero means it has no limit the suite checks.
	MaxState int
}

// token is a fencing token by itself, as a lock's holder passes one.
type token int64

// Token implements checkpoint's fence.
func (t token) Token() int64 { return int64(t) }

// Exercise runs the suite against the store newStore makes: each subtest
// runs in parallel, on a store of its own.
func Exercise(ctx context.Context, t *testing.T, newStore NewStore, opts Options) {
	t.Helper()
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options)
	}{
		{"ChainGetListDelete", chain},
		{"OptimisticConflict", conflict},
		{"TokenFence", tokenFence},
		{"LargeFencedState", largeFencedState},
		{"BadInput", badInput},
		{"AppendForks", appendForks},
		{"ArbitraryMetadata", arbitraryMetadata},
		{"WriteIndexes", writeIndexes},
		{"ManyPendingWrites", manyPendingWrites},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(ctx, t, newStore(t), opts)
		})
	}
}
