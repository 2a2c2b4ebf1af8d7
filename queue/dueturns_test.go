package queue

import "os"

// DROVER_DUE_TURNS=0 turns the workers' movers' turns off, for a
// measurement of them against the parallel batches alone
// (TestDelayedAtScale).
func init() {
	if os.Getenv("DROVER_DUE_TURNS") == "0" {
		dueTurns = false
	}
}
