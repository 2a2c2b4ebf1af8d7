package keyspace

import "fmt"

// AgentAssistants is the prefix of the Agent Server's assistants: one key
// per assistant, holding its current version.
func (s Space) AgentAssistants() string { return s.root + "agent-server/assistants/" }

// AgentAssistant is the key of assistant id.
func (s Space) AgentAssistant(id string) string { return s.AgentAssistants() + id }

// AgentAssistantVersions is the prefix of assistant id's versions.
func (s Space) AgentAssistantVersions(id string) string {
	return s.root + "agent-server/assistant-versions/" + id + "/"
}

// AgentAssistantVersion is the key of version v of assistant id, zero
// padded so that keys sort by version.
func (s Space) AgentAssistantVersion(id string, v int) string {
	return fmt.Sprintf("%s%010d", s.AgentAssistantVersions(id), v)
}

// AgentThreads is the prefix of the Agent Server's threads.
func (s Space) AgentThreads() string { return s.root + "agent-server/threads/" }

// AgentThread is the key of thread id.
func (s Space) AgentThread(id string) string { return s.AgentThreads() + id }

// AgentThreadCopies is the prefix of the marks of thread copies under
// way: a copy writes its mark first and deletes it with the thread it
// creates, so that a mark left behind names a copy interrupted by a crash.
func (s Space) AgentThreadCopies() string { return s.root + "agent-server/copies/" }

// AgentThreadCopy is the mark of the copy to thread id.
func (s Space) AgentThreadCopy(id string) string { return s.AgentThreadCopies() + id }

// AgentServer is the prefix of all the Agent Server's keys of the space.
func (s Space) AgentServer() string { return s.root + "agent-server/" }

// AgentGraphs is the prefix of the graphs runtimes registered.
func (s Space) AgentGraphs() string { return s.root + "agent-server/graphs/" }

// AgentGraph is the key of graph id's registration.
func (s Space) AgentGraph(id string) string { return s.AgentGraphs() + id }

// AgentRuns is the prefix of the runs of thread (every run's, for "").
func (s Space) AgentRuns(thread string) string {
	if thread == "" {
		return s.root + "agent-server/runs/"
	}
	return s.root + "agent-server/runs/" + thread + "/"
}

// AgentRun is the key of run id of thread.
func (s Space) AgentRun(thread, id string) string { return s.AgentRuns(thread) + id }

// AgentThreadStates is the prefix of the threads' states as runtimes
// reported them.
func (s Space) AgentThreadStates() string { return s.root + "agent-server/states/" }

// AgentThreadState is the key of thread id's state, as the runtime that
// ran its last run reported it (its history is under AgentThreadHistory;
// a record of the previous layout holds the history too).
func (s Space) AgentThreadState(id string) string { return s.AgentThreadStates() + id }

// AgentThreadHistories is the prefix of the threads' histories, apart
// from their states (AgentThreadStates), so that a listing of the states
// mixes in no history key.
func (s Space) AgentThreadHistories() string { return s.root + "agent-server/history/" }

// AgentThreadHistory is the prefix of everything of thread id's history:
// its states (AgentThreadHistoryStates) and its gap mark.
func (s Space) AgentThreadHistory(id string) string { return s.AgentThreadHistories() + id + "/" }

// AgentThreadHistoryStates is the prefix of thread id's history states,
// one key per state (AgentThreadHistoryState).
func (s Space) AgentThreadHistoryStates(id string) string {
	return s.AgentThreadHistory(id) + "states/"
}

// AgentThreadHistoryState is the key of the state at position pos of
// thread id's history, pos in 16 hex digits. Positions count down: a newer
// state has a smaller one, so that a range read in key order, which etcd
// cuts at its limit (a descending sort reads the whole range first),
// answers the newest states first. A sequence rather than the checkpoint
// id: a state need not have one, and a runtime's ids need not be ordered.
func (s Space) AgentThreadHistoryState(id string, pos uint64) string {
	return fmt.Sprintf("%s%016x", s.AgentThreadHistoryStates(id), pos)
}

// AgentThreadHistoryGap is the key whose presence says that thread id's
// history skips states (a state update stored on a checkpoint it does not
// hold): an outcome may not append to it, but must send it whole.
func (s Space) AgentThreadHistoryGap(id string) string { return s.AgentThreadHistory(id) + "gap" }

// AgentCrons is the prefix of the Agent Server's crons.
func (s Space) AgentCrons() string { return s.root + "agent-server/crons/" }

// AgentCron is the key of cron id.
func (s Space) AgentCron(id string) string { return s.AgentCrons() + id }

// AgentActiveRuns is the prefix of the index of thread's runs not ended
// (admitted or enqueued): one empty key per run, written and deleted in
// the transactions that create and end the run, so that a create reads
// the thread's active runs without reading its history.
func (s Space) AgentActiveRuns(thread string) string {
	if thread == "" {
		return s.root + "agent-server/active-runs/"
	}
	return s.root + "agent-server/active-runs/" + thread + "/"
}

// AgentActiveRun is the index key of run id of thread, while it is active.
func (s Space) AgentActiveRun(thread, id string) string { return s.AgentActiveRuns(thread) + id }

// AgentActiveRunsIndexed is the key whose presence says that every run
// stored before the index of active runs existed has its index key (the
// backfill of a namespace's first use by a server that reads the index).
// It is outside the index's prefix, so that a truncate keeps it.
func (s Space) AgentActiveRunsIndexed() string { return s.root + "agent-server/active-runs-indexed" }
