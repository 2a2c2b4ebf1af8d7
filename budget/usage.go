package budget

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/droverhq/drover"
)

// resultUsage is the usage object of a model's response, in the shapes
// ResultUsage reads.
type resultUsage struct {
	Total      *int64 `json:"total_tokens"`
	Prompt     *int64 `json:"prompt_tokens"`
	Completion *int64 `json:"completion_tokens"`
	Input      *int64 `json:"input_tokens"`
	Output     *int64 `json:"output_tokens"`
	// CacheWrite is Anthropic's cache_creation_input_tokens, which its
	// input-token rate limit counts beside input_tokens.
	CacheWrite *int64 `json:"cache_creation_input_tokens"`
}

// maxUsageResult bounds the results ResultUsage reads: a queue task's
// result is at most 256 KiB, so a larger one is not a task's result.
const maxUsageResult = 256 << 10

// ResultUsage reads the tokens a task's result says its call used: the
// result is a JSON object whose "usage" object has total_tokens (OpenAI),
// else prompt_tokens and completion_tokens (summed), else input_tokens,
// output_tokens and cache_creation_input_tokens (Anthropic, summed: its
// rate limit counts cache writes as input). ok is false when the result says
// nothing of it (not a JSON object, no usage object, none of those
// fields); an InputError names the field of a usage object that is not a
// whole number of tokens from 0 to MaxTokens.
func ResultUsage(result []byte) (tokens int64, ok bool, err error) {
	trimmed := bytes.TrimSpace(result)
	if len(trimmed) == 0 || len(trimmed) > maxUsageResult || trimmed[0] != '{' || !bytes.Contains(trimmed, []byte(`"usage"`)) {
		return 0, false, nil
	}
	var r struct {
		Usage *json.RawMessage `json:"usage"`
	}
	if json.Unmarshal(trimmed, &r) != nil || r.Usage == nil {
		return 0, false, nil
	}
	var u resultUsage
	if err := json.Unmarshal(*r.Usage, &u); err != nil {
		if bytes.HasPrefix(bytes.TrimSpace(*r.Usage), []byte("{")) {
			return 0, false, &drover.InputError{Field: "usage", Value: string(*r.Usage), Rule: "its token counts must be whole numbers: " + err.Error()}
		}
		return 0, false, nil // "usage" of another kind: not a model's usage
	}
	pairs := []struct {
		a, b   *int64
		fa, fb string
	}{{u.Total, nil, "usage.total_tokens", ""}, {u.Prompt, u.Completion, "usage.prompt_tokens", "usage.completion_tokens"},
		{u.Input, u.Output, "usage.input_tokens", "usage.output_tokens"}}
	for i, p := range pairs {
		if p.a == nil && p.b == nil {
			continue
		}
		var sum int64
		fields := []struct {
			v    *int64
			name string
		}{{p.a, p.fa}, {p.b, p.fb}}
		if i == len(pairs)-1 {
			fields = append(fields, struct {
				v    *int64
				name string
			}{u.CacheWrite, "usage.cache_creation_input_tokens"})
		}
		for _, f := range fields {
			if f.v == nil {
				continue
			}
			if *f.v < 0 || *f.v > MaxTokens {
				return 0, false, &drover.InputError{Field: f.name, Value: *f.v, Rule: fmt.Sprintf("must be between 0 and %d", MaxTokens)}
			}
			sum += *f.v
		}
		return min(sum, MaxTokens), true, nil
	}
	return 0, false, nil
}
