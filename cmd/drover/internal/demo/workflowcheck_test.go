package demo

import (
	"fmt"
	"testing"
)

// goodWorkflow is a run of three searches that kept every invariant.
func goodWorkflow() (WorkflowConfig, WorkflowSummary, Report) {
	cfg := WorkflowConfig{Children: 3}
	s := WorkflowSummary{Children: 3, ChildRuns: 3, ChildrenRunOnce: 3, ChildrenStored: 3,
		StepRuns: map[string]int{"plan": 1, "merge": 1, "act": 1}, StepRecords: 3,
		KilledWorker: "worker-1", KillConfirmed: true, StatusAfterKill: "WAITING",
		SignalWoke: true, SignalRetry: "not stored: a duplicate of the key", SignalsConsumed: 1, SignalSeenVersion: 1,
		ResumedBy: "worker-2", ParentResumes: 1, FinalStatus: "SUCCEEDED", Findings: 3, ApprovedBy: "ana"}
	r := Report{ApprovedBy: "ana"}
	for i := range 3 {
		r.Findings = append(r.Findings, Finding{Topic: fmt.Sprint("topic-", i)})
	}
	return cfg, s, r
}

// TestCheckWorkflowFindsEachBreak: a run that kept every invariant has no
// violation, and each field broken alone gives exactly one.
func TestCheckWorkflowFindsEachBreak(t *testing.T) {
	cfg, s, r := goodWorkflow()
	if v := checkWorkflow(cfg, s, r); len(v) != 0 {
		t.Fatalf("a good run: violations %v", v)
	}
	rows := []struct {
		name   string
		break_ func(s *WorkflowSummary, r *Report)
	}{
		{"a search ran twice", func(s *WorkflowSummary, _ *Report) {
			s.ChildrenRunOnce, s.ChildRuns, s.ChildrenRunMore = 2, 4, []string{"c"}
		}},
		{"a search run not reported", func(s *WorkflowSummary, _ *Report) { s.ChildRuns = 2 }},
		{"a search not stored", func(s *WorkflowSummary, _ *Report) { s.ChildrenStored = 2 }},
		{"a step ran twice", func(s *WorkflowSummary, _ *Report) { s.StepRuns["merge"] = 2 }},
		{"a step record missing", func(s *WorkflowSummary, _ *Report) { s.StepRecords = 2 }},
		{"no worker killed", func(s *WorkflowSummary, _ *Report) { s.KilledWorker = "" }},
		{"the SIGKILL not confirmed", func(s *WorkflowSummary, _ *Report) { s.KillConfirmed = false }},
		{"not waiting after the kill", func(s *WorkflowSummary, _ *Report) { s.StatusAfterKill = "RUNNING" }},
		{"a task running after the kill", func(s *WorkflowSummary, _ *Report) { s.RunningAfterKill = 1 }},
		{"a claim left after the kill", func(s *WorkflowSummary, _ *Report) { s.HeldAfterKill = []string{"claim"} }},
		{"the signal did not wake", func(s *WorkflowSummary, _ *Report) { s.SignalWoke = false }},
		{"the retry stored a signal", func(s *WorkflowSummary, _ *Report) { s.SignalRetryStored = true }},
		{"the retry not sent", func(s *WorkflowSummary, _ *Report) { s.SignalRetry = "" }},
		{"two signals consumed", func(s *WorkflowSummary, _ *Report) { s.SignalsConsumed = 2 }},
		{"a signal left", func(s *WorkflowSummary, _ *Report) { s.SignalsLeft = 1 }},
		{"the tombstone written twice", func(s *WorkflowSummary, _ *Report) { s.SignalSeenVersion = 2 }},
		{"resumed twice", func(s *WorkflowSummary, _ *Report) { s.ParentResumes = 2 }},
		{"resumed by nobody", func(s *WorkflowSummary, _ *Report) { s.ResumedBy = "" }},
		{"resumed by the dead worker", func(s *WorkflowSummary, _ *Report) { s.ResumedBy = "worker-1" }},
		{"not SUCCEEDED", func(s *WorkflowSummary, _ *Report) { s.FinalStatus = "FAILED" }},
		{"a finding missing", func(s *WorkflowSummary, _ *Report) { s.Findings = 2 }},
		{"two findings of one topic", func(_ *WorkflowSummary, r *Report) { r.Findings[1].Topic = r.Findings[0].Topic }},
		{"approved by another", func(s *WorkflowSummary, _ *Report) { s.ApprovedBy = "bob" }},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			cfg, s, r := goodWorkflow()
			row.break_(&s, &r)
			if v := checkWorkflow(cfg, s, r); len(v) != 1 {
				t.Fatalf("%d violations, want 1: %v", len(v), v)
			}
		})
	}
}
