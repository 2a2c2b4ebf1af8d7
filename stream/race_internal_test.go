//go:build race

package stream

// raceEnabled: the race detector makes sync.Pool drop what it is given
// (encoding/json's scanners among it), so allocations are not counted
// under it.
const raceEnabled = true
