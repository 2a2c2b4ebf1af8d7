package queue

import "time"

// OutcomeSize builds the writes that record outcome kind (Succeeded or
// Dead, with result or reason) of task t claimed from queue q, as a
// Worker's outcome writer builds them: for a task with a record of its
// own, or (inRun) one of a segment run. It returns the size they are
// counted as when outcomes are packed into requests, and the bytes of
// the keys and values they put.
func OutcomeSize(c *Client, q string, t *Task, kind Status, result []byte, reason error, inRun bool) (counted, written int) {
	w := c.remote.outcomeWorker(q, "w")
	now := time.Now().UTC()
	cl := &claim{task: t, claimKey: "claim", pendingKey: "pending", token: 1, claimedAt: now}
	o := outcome{c: cl, kind: kind, result: result, err: reason}
	if !inRun {
		_, ops, n := w.ackOp(o, now, map[string]bool{})
		return n, putBytes(ops)
	}
	cl.run = &segRun{seg: "s", runKey: "run", tryKey: "try", token: 1, claimedAt: now}
	reqs, _ := w.runReqs(cl.run, []outcome{o}, false, true, now, map[string]bool{})
	for _, r := range reqs {
		counted += r.size
		written += putBytes(r.then)
	}
	return counted, written
}
