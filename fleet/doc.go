// Package fleet assembles a queue worker for a fleet of agents as drover
// worker does, so that a Go program runs the same worker without the
// command line.
//
// A worker is assembled in this order: the process's primary lease
// (package process), the flow control gates of its spec (package flow:
// quotas and breakers, then rate limits, their quota slots bound to that
// lease), the queue worker (package queue) whose claims are bound to the
// same lease, its registry entry under that lease too (package registry:
// component "worker", its load refreshed every 2 s), then its handlers. It
// runs until its context ends, its queue is drained (Drain), or its lease
// is lost; then it is taken down in the reverse order, and the lease's
// revocation removes its registry entry at once. If the process dies, its
// claims, quota slots and registry entry all end with the lease.
//
// The main call:
//
//	spec, err := flow.ParseSpec([]string{"openai=500/m"}, []string{"tenant=2"}, nil)
//	err = fleet.RunWorker(ctx, cli, fleet.Config{
//		Worker:  queue.WorkerConfig{Queue: "emails", Concurrency: 16},
//		Flow:    spec,
//		Handler: summarize,
//	})
//
// NewWorker, Worker.Run and Worker.Close split RunWorker for a program that
// reads the worker's id or counts. Gate adapts any flow gate to a queue
// worker, and RegisterWorker registers a worker assembled by hand.
package fleet
