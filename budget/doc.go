// Package budget shares a model provider's limits between the tenants of a
// fleet: a budget is a number of requests and tokens per window under a key
// such as "openai/gpt-4.1/key-prod", with optional per-tenant caps and
// weights.
//
// Work reserves an estimate before it calls the model and settles with what
// the call really used: the difference is refunded or charged. A settle may
// carry the provider's own rate-limit headers, which lower drover's view of
// what is left to the provider's. Each reservation is a key bound to an
// etcd lease, so a holder that dies without settling releases it when its
// lease ends: nothing leaks.
//
// When demand exceeds a budget, tenants get shares by weight: a tenant that
// asked for tokens in this window or the last is active, and each active
// tenant's share of the window's tokens is protected from the others, while
// a share nobody claims goes to whoever asks. A refusal is a
// *drover.DeferError that says how long to wait (until the window turns), so
// a queue worker hands the task back without counting an attempt.
//
// Reserve and Settle are each one read and one compare-and-swap transaction
// in etcd; docs/budgets.md gives the keys and the reasoning.
//
//	b := budget.New(cli, "drover")
//	defer b.Close()
//	_, err := b.Set(ctx, budget.Budget{Key: "openai/gpt-4.1/key-prod", Tokens: 30000, Requests: 500, WindowSeconds: 60})
//	r, err := b.Reserve(ctx, "openai/gpt-4.1/key-prod", "acme", 1200)
//	// err: a *drover.DeferError when the budget is spent for now
//	// ... call the model ...
//	_, err = b.Settle(ctx, r, usage.TotalTokens, resp.Header)
package budget
