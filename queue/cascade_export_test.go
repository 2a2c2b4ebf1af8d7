package queue

import (
	"time"
)

// SetCascadeRunHook sets the hook called as the cascade of an ended task
// begins (after its end and cascade mark are written); nil unsets. Call it
// before any worker starts.
func SetCascadeRunHook(before func(parent string)) { beforeCascadeRun = before }

// SetCascadeRescan sets how often workers read their queue's cascade
// marks, and returns a function that restores it. Call it before any
// worker starts.
func SetCascadeRescan(d time.Duration) (restore func()) {
	old := cascadeRescan
	cascadeRescan = d
	return func() { cascadeRescan = old }
}

// SetShortWaitValues sets whether parks write wait keys' values in their
// short form, and returns a function that restores it. Call it before any
// worker starts.
func SetShortWaitValues(on bool) (restore func()) {
	old := shortWaitValues
	shortWaitValues = on
	return func() { shortWaitValues = old }
}
