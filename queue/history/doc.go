// Package history reads a queue's history: for each minute of the last
// hour or day, the tasks processed, failed, retried and deferred, the
// queue's depth at the minute's end and the latency from submission to
// first claim. Every drover server counts these from the keys the queue
// already writes (no write per task) and closes each minute into a small
// record in etcd, so any process reads the same history, and a restart of
// the servers loses none of it (docs/queue.md, "Queue history").
//
//	h, err := history.Read(ctx, etcdClient, "drover", "emails", history.Hour)
//	fmt.Println(h.Total.Processed, h.Latency.Percentile(0.99))
package history
