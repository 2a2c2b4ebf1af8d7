package httpapi

import "context"

// SetAfterClaim sets the hook run when a claim has its tasks, before its
// answer is written, until the returned func restores it.
func SetAfterClaim(f func(ctx context.Context, q string)) (restore func()) {
	old := afterClaim.Swap(&f)
	return func() { afterClaim.Store(old) }
}
