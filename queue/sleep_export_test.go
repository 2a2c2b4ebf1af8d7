package queue

import (
	"context"
	"log/slog"
	"time"
)

// SetWorkerClock sets the clock of w's own client: the one its sleep index
// moves sleeping tasks by and its step tasks judge their sleeps by.
func SetWorkerClock(w *Worker, now func() time.Time) { w.client.now = now }

// MoveSleeps moves queue q's due sleeping tasks back to pending as a
// worker whose clock reads now would; it returns how many it moved.
func MoveSleeps(ctx context.Context, c *Client, q string, now func() time.Time) (int, error) {
	ix := c.sleepIndex(q, slog.Default())
	ix.Now = now
	_, n, err := ix.Promote(ctx)
	return n, err
}
