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
