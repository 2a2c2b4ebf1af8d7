//go:build !race

package stream

// raceEnabled: see race_internal_test.go.
const raceEnabled = false
