package queue

import "time"

// SetWorkerClock sets the clock of w's own client: the one its sleep index
// moves sleeping tasks by and its step tasks judge their sleeps by.
func SetWorkerClock(w *Worker, now func() time.Time) { w.client.now = now }
