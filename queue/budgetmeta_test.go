package queue_test

import (
	"errors"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/queue"
)

// TestBudgetMetadata: a task's budget and estimated tokens are checked on
// submission, each bad one named.
func TestBudgetMetadata(t *testing.T) {
	for _, c := range []struct {
		name  string
		meta  queue.Metadata
		field string
	}{
		{"budget and estimate", queue.Metadata{Budget: "openai/gpt-4.1/key-prod", EstimatedTokens: 1200}, ""},
		{"budget alone", queue.Metadata{Budget: "openai/gpt-4.1/key-prod"}, ""},
		{"negative estimate", queue.Metadata{Budget: "openai/gpt-4.1/key-prod", EstimatedTokens: -1}, "metadata.estimated_tokens"},
		{"absurd estimate", queue.Metadata{Budget: "openai/gpt-4.1/key-prod", EstimatedTokens: 2e9}, "metadata.estimated_tokens"},
		{"estimate without a budget", queue.Metadata{EstimatedTokens: 10}, "metadata.budget"},
		{"bad budget key", queue.Metadata{Budget: "openai//key", EstimatedTokens: 10}, "metadata.budget"},
	} {
		t.Run(c.name, func(t *testing.T) {
			task := queue.Task{Type: "chat", Metadata: c.meta}
			err := task.Validate()
			var in *drover.InputError
			switch {
			case c.field == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.field != "" && (!errors.As(err, &in) || in.Field != c.field):
				t.Fatalf("%v, want an InputError for %s", err, c.field)
			}
		})
	}
}
