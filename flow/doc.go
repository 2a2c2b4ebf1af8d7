// Package flow keeps a fleet of workers within the limits of what they
// call: rate limits shared by every worker (a token bucket in etcd, handed
// out in batches), concurrency quotas (lease-bound slots), circuit breakers
// shared by the fleet, and the gates that apply them to calls.
//
// Everything is configured in etcd under /{ns}/limits/, so a change made
// with `drover limits set` reaches every worker within a second (watch) and
// nothing restarts.
//
// A Gate admits a Call (its id, type and tenant) before it runs and hears
// how it ended; it may make the call wait (rate limits) or refuse it for now
// with a *DeferError (quotas, open breakers). The package knows nothing of
// queues: package fleet adapts gates to a queue worker, and assembles a
// worker with them as drover worker does.
//
//	spec, err := flow.ParseSpec([]string{"openai=500/m"}, []string{"tenant=2"}, []string{"crm;failures=5"})
//	gates, closeGates, err := spec.Gates(ctx, cli, "drover", func() clientv3.LeaseID { return leaseID })
//	defer closeGates(context.Background())
//	done, err := gates[0].Admit(ctx, flow.Call{ID: "call-1", Type: "chat", Tenant: "acme"})
//	// err: ctx ended, or a *DeferError; otherwise make the call, then
//	// done(callErr) when done is not nil.
package flow
