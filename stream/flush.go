package stream

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// group is one stream's requests in a batch, and what the batch writes
// of it.
type group struct {
	a    *attempt
	reqs []*request

	ops     []clientv3.Op
	claim   []clientv3.Cmp // the compares of its claim in ops, if any
	written chunk          // the chunk the ops write
	first   int64
	done    bool // answered: nothing (more) to write
}

// flush writes a batch: every stream's new events, each stream's part
// fenced by its claim, in as few transactions as etcd takes. A stream
// that another writer of the same claim wrote first is read again and
// tried again, twice at most. Each transaction holds at most one
// attempt of a task: etcd checks every compare of a transaction before
// any of its writes, so two attempts of one stream in one would both
// find the same place free.
func (w *Writer) flush(ctx context.Context, reqs []*request) {
	var groups []*group
	byAttempt := map[*attempt]*group{}
	for _, r := range reqs {
		g := byAttempt[r.a]
		if g == nil {
			g = &group{a: r.a}
			byAttempt[r.a] = g
			groups = append(groups, g)
		}
		g.reqs = append(g.reqs, r)
	}
	tries := map[*group]int{}
	for len(groups) > 0 {
		var now, later []*group
		tasks := map[string]bool{}
		for _, g := range groups {
			if tasks[g.a.c.Task] {
				g.a.known = false // the attempt before may write it: read it again
				later = append(later, g)
				continue
			}
			tasks[g.a.c.Task] = true
			now = append(now, g)
		}
		err := w.readHeads(ctx, now)
		for try := 0; err != nil && try < 2 && ctx.Err() == nil; try++ {
			err = w.readHeads(ctx, now) // a read: trying again writes nothing twice
		}
		if err != nil {
			for _, g := range groups {
				g.answer(err)
			}
			return
		}
		var send []*group
		for _, g := range now {
			g.done = false
			w.build(g)
			if !g.done {
				send = append(send, g)
			}
		}
		for _, g := range w.commit(ctx, send) {
			if tries[g]++; tries[g] >= 3 {
				g.answer(fmt.Errorf("%w: task %s", errConflict, g.a.c.Task))
				continue
			}
			later = append(later, g)
		}
		groups = later
	}
}

// answer ends every request of g not answered yet with err.
func (g *group) answer(err error) {
	for _, r := range g.reqs {
		if !r.done {
			r.err, r.done = err, true
		}
	}
	g.done = true
}

// readHeads reads the last chunk of every stream of groups not known.
func (w *Writer) readHeads(ctx context.Context, groups []*group) error {
	var unknown []*group
	for _, g := range groups {
		if !g.a.known && g.a.err == nil {
			unknown = append(unknown, g)
		}
	}
	for len(unknown) > 0 {
		n := min(len(unknown), streamsPerTxn)
		ops := make([]clientv3.Op, n)
		for i, g := range unknown[:n] {
			ops[i] = clientv3.OpGet(w.keys.StreamChunks(g.a.c.Task), clientv3.WithPrefix(),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
		}
		resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("stream: read the streams' last events: %w", err)
		}
		for i, g := range unknown[:n] {
			a := g.a
			a.known, a.exists, a.last, a.events, a.bytes = true, false, 0, 0, 0
			a.lastToken, a.lastAttempt, a.lastType = 0, 0, ""
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			c, err := decodeChunk(string(kvs[0].Key), kvs[0].Value)
			if err != nil || len(c.List) == 0 {
				return fmt.Errorf("stream: task %s: %w", a.c.Task, err)
			}
			ev := c.List[len(c.List)-1]
			a.exists, a.last, a.events, a.bytes = true, ev.Seq, c.Events, c.Bytes
			a.lastToken, a.lastAttempt, a.lastType = c.Token, c.Attempt, ev.Type
		}
		unknown = unknown[n:]
	}
	return nil
}

// build makes g's chunk and the operations that write it, or answers g
// when there is nothing to write or it cannot be written.
func (w *Writer) build(g *group) {
	if g.a.final {
		w.buildFinal(g)
		return
	}
	a, f := g.a, g.a.c.Fence
	token := f.Token()
	switch {
	case a.err != nil:
		g.answer(a.err)
		return
	case f.Err() != nil:
		a.err = fmt.Errorf("%w: claim of task %s token %d: %w", ErrFenced, a.c.Task, token, f.Err())
	case a.lastToken > token:
		a.err = fmt.Errorf("%w: claim of task %s token %d: attempt %d (token %d) has written its stream since",
			ErrFenced, a.c.Task, token, a.lastAttempt, a.lastToken)
	}
	if a.err != nil {
		g.answer(a.err)
		return
	}
	c := chunk{Attempt: a.c.Attempt, Token: token, Events: a.events, Bytes: a.bytes}
	seq := a.last
	add := func(typ string, data json.RawMessage, at time.Time) {
		seq++
		c.List = append(c.List, Event{Seq: seq, Attempt: a.c.Attempt, Type: typ, Data: data, Time: at})
	}
	opening := a.lastToken != token
	for _, r := range g.reqs {
		r.first, r.last = 0, 0
		if r.done || (r.probe && !a.exists && len(c.List) == 0) {
			continue // answered, or an end of a stream that has no events
		}
		if opening && len(c.List) == 0 {
			if a.exists && !ends(a.lastType) {
				add(AttemptLost, ownData{Attempt: a.lastAttempt, Token: a.lastToken}.raw(), r.at)
			}
			add(AttemptStarted, ownData{Attempt: a.c.Attempt, Worker: a.c.Worker, Token: token}.raw(), r.at)
		}
		if len(r.events) > 0 {
			n, b := int64(len(r.events)), int64(0)
			for _, in := range r.events {
				b += int64(in.size())
			}
			if c.Events+n > w.lim.MaxEvents || c.Bytes+b > w.lim.MaxBytes {
				r.err = fmt.Errorf("%w: task %s: %d events of %d bytes would take it past %d events or %d bytes",
					ErrStreamFull, a.c.Task, n, b, w.lim.MaxEvents, w.lim.MaxBytes)
				r.done = true
				continue
			}
			c.Events, c.Bytes = c.Events+n, c.Bytes+b
			r.first = seq + 1
			for _, in := range r.events {
				data := in.Data
				if len(data) == 0 {
					data = json.RawMessage("null")
				}
				at := in.at
				if at.IsZero() {
					at = r.at
				}
				add(in.Type, data, at)
			}
			r.last = seq
		}
		if r.end != nil {
			add(r.end.Type, r.end.Data, r.at)
			r.last = seq
		}
	}
	if len(c.List) == 0 {
		g.answer(nil)
		return
	}
	w.ops(g, c)
}

// buildFinal makes the chunk of a task's Done (Finish): after the
// stream's last event, as the attempt that wrote it, fenced by the
// stream alone (the request's claimGone).
func (w *Writer) buildFinal(g *group) {
	a := g.a
	r := g.reqs[0]
	if !a.exists || a.lastType == Done || r.done {
		g.answer(nil)
		return
	}
	var d ownData
	_ = json.Unmarshal(r.end.Data, &d)
	d.Attempt = a.lastAttempt
	c := chunk{Attempt: a.lastAttempt, Token: a.lastToken, Events: a.events, Bytes: a.bytes}
	c.List = []Event{{Seq: a.last + 1, Attempt: a.lastAttempt, Type: Done, Data: d.raw(), Time: r.at}}
	r.first, r.last = a.last+1, a.last+1
	w.ops(g, c)
}

// ops sets the operations that write chunk c of g's stream.
func (w *Writer) ops(g *group, c chunk) {
	a := g.a
	first, last := a.last+1, c.List[len(c.List)-1].Seq
	ops := []clientv3.Op{clientv3.OpPut(w.keys.StreamChunk(a.c.Task, first, last), string(c.encode()))}
	now := w.now()
	if !a.exists {
		ops = append(ops, clientv3.OpPut(keyspace.TimedKey(w.keys.StreamExpiries(), now.Add(w.lim.MaxAge).UnixNano(), a.c.Task), ""))
	}
	if c.List[len(c.List)-1].Type == Done {
		ops = append(ops, clientv3.OpPut(keyspace.TimedKey(w.keys.StreamExpiries(), now.Add(w.lim.Retention).UnixNano(), a.c.Task), ""))
	}
	free := clientv3.Compare(clientv3.CreateRevision(w.keys.StreamChunkStart(a.c.Task, first)), "=", 0).WithPrefix()
	var claim []clientv3.Cmp
	if a.c.Fence != nil {
		claim = a.c.Fence.Compares()
	}
	for _, r := range g.reqs {
		if r.claimGone && !r.done {
			claim = nil // the attempt's outcome ended its claim: no later attempt wrote (free) is the fence
		}
	}
	// One level: the claim's compares and the stream's together (a
	// nested level per stream cost etcd a request, a decode and an apply
	// of its own, a thousand times a transaction). Which one failed is
	// asked only when one did (claimsHold).
	g.ops = []clientv3.Op{clientv3.OpTxn(append(slices.Clip(claim), free), ops, nil)}
	g.claim = claim
	g.written, g.first = c, first
}

// commit sends the groups' operations in one transaction, and returns
// the groups to try again: another writer of their claim wrote first.
// etcd takes at most 128 operations a transaction level (its default
// --max-txn-ops), less those of the levels above, so the streams go in
// parts of streamsPerTxn, each part one nested transaction.
func (w *Writer) commit(ctx context.Context, groups []*group) (again []*group) {
	var parts [][]*group
	var ops []clientv3.Op
	for i := 0; i < len(groups); i += streamsPerTxn {
		part := groups[i:min(i+streamsPerTxn, len(groups))]
		var pops []clientv3.Op
		for _, g := range part {
			pops = append(pops, g.ops...)
		}
		parts = append(parts, part)
		ops = append(ops, clientv3.OpTxn(nil, pops, nil))
	}
	if len(ops) == 0 {
		return nil
	}
	w.txns.Add(1)
	resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		for _, g := range groups {
			g.a.known = false // it may have been written: read again
			g.answer(fmt.Errorf("stream: write task %s's events: %w", g.a.c.Task, err))
		}
		return nil
	}
	var failed []*group
	for pi, part := range parts {
		presp := resp.Responses[pi].GetResponseTxn()
		for i, g := range part {
			if presp.Responses[i].GetResponseTxn().Succeeded {
				w.wrote(g)
			} else {
				failed = append(failed, g)
			}
		}
	}
	return w.refused(ctx, failed)
}

// wrote applies a write of g that succeeded to its attempt.
func (w *Writer) wrote(g *group) {
	a, c := g.a, g.written
	ev := c.List[len(c.List)-1]
	a.exists, a.last, a.events, a.bytes = true, ev.Seq, c.Events, c.Bytes
	a.lastToken, a.lastAttempt, a.lastType = c.Token, c.Attempt, ev.Type
	g.answer(nil)
}

// refused sorts the groups whose write was refused: those whose claim
// no longer holds are fenced; the others found their place taken
// (another writer of the claim wrote first), and are returned to be
// read again and tried again.
func (w *Writer) refused(ctx context.Context, groups []*group) (again []*group) {
	held, err := w.claimsHold(ctx, groups)
	for i, g := range groups {
		switch {
		case err != nil:
			g.a.known = false
			g.answer(fmt.Errorf("stream: write task %s's events: %w", g.a.c.Task, err))
		case !held[i]:
			a := g.a
			a.err = fmt.Errorf("%w: claim of task %s token %d: a write under it was refused: it is held by a later attempt or gone",
				ErrFenced, a.c.Task, a.c.Fence.Token())
			g.answer(a.err)
		default:
			g.a.known = false
			again = append(again, g)
		}
	}
	return again
}

// claimsHold says, for each group, whether its claim's compares hold
// (a group without any holds): one read-only transaction, in parts as
// commit's.
func (w *Writer) claimsHold(ctx context.Context, groups []*group) ([]bool, error) {
	held := make([]bool, len(groups))
	var ops []clientv3.Op
	for i := 0; i < len(groups); i += streamsPerTxn {
		var part []clientv3.Op
		for _, g := range groups[i:min(i+streamsPerTxn, len(groups))] {
			part = append(part, clientv3.OpTxn(g.claim, nil, nil))
		}
		ops = append(ops, clientv3.OpTxn(nil, part, nil))
	}
	if len(ops) == 0 {
		return held, nil
	}
	resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("stream: read the claims of refused writes: %w", err)
	}
	for pi, r := range resp.Responses {
		for i, pr := range r.GetResponseTxn().Responses {
			held[pi*streamsPerTxn+i] = pr.GetResponseTxn().Succeeded
		}
	}
	return held, nil
}
