// Package qstats keeps each queue's history: per minute, the tasks that
// succeeded (processed), failed for good (failed: moved to the dead-letter
// queue), were scheduled for a retry (retried) and were deferred by flow
// control (deferred), the queue's depth at the minute's end, and the time
// from a task's submission (or due time) to its first claim.
//
// Nothing is written per task. A [Recorder], which `drover server` runs
// for its namespace, watches the keys the queue already writes (outcome
// batches, done, retry and dead keys, runs) and counts them in memory;
// once a minute the first server to close the minute writes one record per
// queue that had something to record, and moves the mark that says
// through which store revision the records count, in one transaction
// that compares the mark (records past what a transaction takes follow
// in more, each compared with the mark the first wrote). So every event
// is counted in at most one minute, and in exactly one unless a server
// fails between those transactions, whichever server writes it; every server reads the same
// records; and a restarted server goes on from the mark (it watches from
// the mark's revision, which the store keeps for its compaction
// retention, an hour by default), unless the mark's minute ended more
// than five minutes ago: then it counts from its start, and its first
// minute says Gap.
//
//	rec, err := qstats.NewRecorder(qstats.Config{Client: cli, Namespace: "drover", Depth: depths})
//	rec.Start(ctx) // the server's dashboard hub does this for each namespace it follows
//	defer rec.Stop(ctx)
//	h, err := qstats.Read(ctx, cli, "drover", "emails", qstats.Hour, time.Now())
//	fmt.Println(h.Total.Processed, h.Latency.Percentile(0.99))
//
// The records are bound to a lease of a day and two hours: a day of
// history is kept, and older minutes vanish on their own. A queue whose
// depth is not zero gets a record at least hourly, so the depth read at a
// window's start is never one whose record has gone.
package qstats
