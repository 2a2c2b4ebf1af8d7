package task_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/task"
)

// ParseWaitText reads what exec steps write to DROVER_WAIT_FILE (the one
// reader of both the queue's exec steps and drover task run's): names
// and an optional timeout; bad text is an InputError naming the file and
// the rule.
func TestParseWaitText(t *testing.T) {
	for _, c := range []struct {
		text    string
		names   []string
		timeout time.Duration
	}{
		{"approval", []string{"approval"}, 0},
		{" approval 24h\n", []string{"approval"}, 24 * time.Hour},
		{"approve,reject 90", []string{"approve", "reject"}, 90 * time.Second},
	} {
		req, err := task.ParseWaitText("DROVER_WAIT_FILE", c.text)
		if err != nil || !slices.Equal(req.Signals, c.names) || req.Timeout != c.timeout {
			t.Errorf("%q: %+v, %v; want %v for %v", c.text, req, err, c.names, c.timeout)
		}
	}
	for _, c := range []struct{ text, field, rule string }{
		{"", "DROVER_WAIT_FILE", "NAME[,NAME...] [TIMEOUT]"},
		{"a 1h extra", "DROVER_WAIT_FILE", "NAME[,NAME...] [TIMEOUT]"},
		{"a 2026-12-01T09:00:00Z", "DROVER_WAIT_FILE", "the timeout must be a duration"},
		{"a soon", "DROVER_WAIT_FILE", "must be a duration"},
		{"a,a", "DROVER_WAIT_FILE signal name", "listed once"},
		{"bad/name", "DROVER_WAIT_FILE signal name", ""},
		{"a -5", "DROVER_WAIT_FILE", "not be negative"},
	} {
		_, err := task.ParseWaitText("DROVER_WAIT_FILE", c.text)
		var ie *drover.InputError
		if !errors.As(err, &ie) || ie.Field != c.field || !strings.Contains(ie.Rule, c.rule) {
			t.Errorf("%q: %v; want an input error of %s saying %q", c.text, err, c.field, c.rule)
		}
	}
}
