package task

import (
	"context"

	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
)

// ClaimLock is claimLock for the tests, waiting: the hold of task id
// through a lock of locker, and its release.
func (s *Store) ClaimLock(ctx context.Context, locker lock.Locker, id string) (lease.Fence, func(context.Context) error, error) {
	f, err := s.claimLock(ctx, locker, id, ClaimOptions{Wait: true})
	if err != nil {
		return nil, nil, err
	}
	return f, f.Release, nil
}

// PlanOnly writes the plan of children as step step of task id would,
// under fence f, and not the step's checkpoint: a run that died between
// the two.
func (s *Store) PlanOnly(ctx context.Context, f lease.Fence, id string, step int, children []Child) error {
	planned, err := planChildren(id, step, &SpawnRequest{Children: children})
	if err != nil {
		return err
	}
	chunks, err := chunkPlan(planned)
	if err != nil {
		return err
	}
	prev, err := s.Load(ctx, id)
	if err != nil {
		return err
	}
	pw, err := s.writePlan(ctx, f, prev, id, step, chunks, 0)
	if err != nil {
		return err
	}
	return s.fencedPut(ctx, f, pw.ops...)
}

// LoadAfter is loadAfter for the tests.
func (s *Store) LoadAfter(ctx context.Context, id string, after int64) (Checkpoint, error) {
	return s.loadAfter(ctx, id, after)
}
