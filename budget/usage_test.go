package budget_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
)

// TestResultUsage reads the usage of a result in each shape, prefers
// total_tokens, says nothing of results without one, and names the field
// of a usage that is not a number of tokens.
func TestResultUsage(t *testing.T) {
	for _, c := range []struct {
		result string
		tokens int64
		ok     bool
		field  string
	}{
		{`{"usage":{"total_tokens":30,"prompt_tokens":1,"completion_tokens":1}}`, 30, true, ""},
		{` {"usage":{"prompt_tokens":10,"completion_tokens":15}}`, 25, true, ""},
		{`{"usage":{"prompt_tokens":10}}`, 10, true, ""},
		{`{"usage":{"input_tokens":20,"output_tokens":5,"cache_read_input_tokens":9}}`, 25, true, ""},
		{`{"usage":{"input_tokens":20,"output_tokens":5,"cache_creation_input_tokens":100,"cache_read_input_tokens":9}}`, 125, true, ""},
		{`{"usage":{"cache_creation_input_tokens":-1,"input_tokens":1}}`, 0, false, "usage.cache_creation_input_tokens"},
		{`{"usage":{"total_tokens":7},"pad":"` + strings.Repeat("x", 256<<10) + `"}`, 0, false, ""},
		{`{"usage":{"total_tokens":0}}`, 0, true, ""},
		{`{"usage":{}}`, 0, false, ""},
		{`{"usage":"much"}`, 0, false, ""},
		{`{"text":"no usage here"}`, 0, false, ""},
		{`"usage"`, 0, false, ""},
		{`not json {"usage"`, 0, false, ""},
		{`{"usage":{"total_tokens":-3}}`, 0, false, "usage.total_tokens"},
		{`{"usage":{"input_tokens":1,"output_tokens":2000000000}}`, 0, false, "usage.output_tokens"},
		{`{"usage":{"total_tokens":1.5}}`, 0, false, "usage"},
		{`{"usage":{"total_tokens":"12"}}`, 0, false, "usage"},
	} {
		n, ok, err := budget.ResultUsage([]byte(c.result))
		var ie *drover.InputError
		switch {
		case c.field != "" && (!errors.As(err, &ie) || ie.Field != c.field):
			t.Errorf("%s: %v, want an InputError naming %s", c.result, err, c.field)
		case c.field == "" && err != nil:
			t.Errorf("%s: %v", c.result, err)
		case n != c.tokens || ok != c.ok:
			t.Errorf("%s: %d %v, want %d %v", c.result, n, ok, c.tokens, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "usage") {
			t.Errorf("%s: %v does not name the usage", c.result, err)
		}
	}
}
