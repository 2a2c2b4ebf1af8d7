package ui_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// fillBudgets sets two budgets: one with settled and held tokens of
// three tenants (weights and a cap), and one without a token limit.
func fillBudgets(s *site) {
	const b = "/v1/budgets/openai%2Fgpt-4.1%2Fkey-prod"
	s.do("PUT", b, map[string]any{"tokens": 30000, "requests": 500, "window_seconds": 3600,
		"weights": map[string]any{"acme": 1, "globex": 3}, "caps": map[string]any{"trial": 2000}}, 200)
	r := s.do("POST", b+"/reserve", map[string]any{"tenant": "acme", "estimate": 1200}, 201)
	s.do("POST", b+"/reservations/"+r["id"].(string)+"/settle", map[string]any{"actual": 950}, 200)
	r = s.do("POST", b+"/reserve", map[string]any{"tenant": "trial", "estimate": 600}, 201)
	s.do("POST", b+"/reservations/"+r["id"].(string)+"/settle", map[string]any{"actual": 700}, 200)
	s.do("POST", b+"/reserve", map[string]any{"tenant": "globex", "estimate": 4000, "ttl_seconds": 600}, 201)
	s.do("PUT", "/v1/budgets/anthropic%2Fclaude%2Fkey-batch", map[string]any{"requests": 50, "window_seconds": 60}, 200)
}

// TestUIBudgets: the budgets page shows each budget's used, reserved and
// remaining tokens, its requests, and each tenant's part with its weight
// and cap, as GET /v1/budgets reports them.
func TestUIBudgets(t *testing.T) {
	s := newSite(t)
	fillBudgets(s)
	tb := newTab(t)
	tb.do("open the budgets page", chromedp.Navigate(s.base+"/ui/#/budgets"))
	tb.waitJS("the budgets", `!!document.querySelector('[data-budget="openai/gpt-4.1/key-prod"] [data-tenant="globex"]') && !!document.querySelector('[data-budget="anthropic/claude/key-batch"]')`)
	row := func(sel string) string {
		t.Helper()
		return strings.Join(strings.Fields(eval[string](tb, `document.querySelector('`+sel+`').innerText`)), " ")
	}
	prod := `[data-budget="openai/gpt-4.1/key-prod"]`
	summary := row(prod + ` tr.budget-summary`)
	for _, want := range []string{"30,000 tokens and 500 requests per 1 h", "1,650", "4,000", "1 live", "24,350", "3 / 500"} {
		if !strings.Contains(summary, want) {
			t.Errorf("the budget's summary %q does not show %q", summary, want)
		}
	}
	for tenant, want := range map[string]string{
		"acme":   "acme 1 – 1 950 0",
		"globex": "globex 3 – 1 0 4,000",
		"trial":  "trial 1 2,000 1 700 0",
	} {
		if got := row(prod + ` tr[data-tenant="` + tenant + `"]`); !strings.HasPrefix(got, want) {
			t.Errorf("tenant %s: %q, want %q", tenant, got, want)
		}
	}
	if got := row(`[data-budget="anthropic/claude/key-batch"] tr.budget-summary`); !strings.Contains(got, "50 requests per 1 min") || !strings.Contains(got, "no limit") {
		t.Errorf("the budget without a token limit: %q", got)
	}
	tb.noConsoleErrors()
}
