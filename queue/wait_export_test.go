package queue

import "context"

// TaskIDOf is the id of the task whose handler (or step) ctx is; "" outside
// a worker.
func TaskIDOf(ctx context.Context) string {
	if f, ok := ctx.Value(claimKey{}).(*claimFence); ok {
		return f.c.task.ID
	}
	return ""
}
