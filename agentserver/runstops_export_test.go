package agentserver

// RunStopsOpen is how many stop streams (GET /v1/agent-server/runs/stops)
// this process answers now.
func RunStopsOpen() int64 { return runStopsOpen.Load() }
