package agentserver

import "time"

// SetRunTaskCheck sets how often a wait reads the task of a run not
// ended, until the returned restore is called.
func SetRunTaskCheck(d time.Duration) (restore func()) {
	old := runTaskCheck
	runTaskCheck = d
	return func() { runTaskCheck = old }
}

// TaskChecks is how many times the waits read a run's task.
func TaskChecks() int64 { return taskChecks.Load() }

// SetAfterOutcomeRead calls f with the task's id between each outcome's
// read of its run's stream and its append, until the returned restore
// is called.
func SetAfterOutcomeRead(f func(task string)) (restore func()) {
	old := afterOutcomeRead.Swap(&f)
	return func() { afterOutcomeRead.Store(old) }
}
