package queue_test

import (
	"testing"

	"github.com/droverhq/drover/queue"
)

// The waits' tests pass with wait keys written in their short form: a
// signal wakes the task, a timeout moves it back to pending, a cancel and
// a purge remove its key, and signals racing the park are never missed.
func TestWaitsWithShortWaitValues(t *testing.T) {
	defer queue.SetShortWaitValues(true)()
	t.Run("wake", TestWaitSignalWakesParkedTask)
	t.Run("timeout", TestWaitTimesOut)
	t.Run("cancel and purge", TestWaitCancelAndPurge)
	t.Run("race", TestWaitSignalRacesThePark)
}
