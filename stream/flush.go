package stream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// group is one stream's requests in a batch, and what the batch writes
// of it.
type group struct {
	a    *attempt
	reqs []*request

	part    txnPart        // its part of the batch's transaction
	claim   []clientv3.Cmp // the compares of its claim in part, if any
	written chunk          // the chunk the part writes
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
		for _, g := range now {
			if g.placedElsewhere() {
				g.a.known = false // this writer's view may be behind the stream as stored: read it
			}
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
		again, full := w.commit(ctx, send)
		for _, g := range again {
			if tries[g]++; tries[g] >= 3 {
				g.answer(fmt.Errorf("%w: task %s", errConflict, g.a.c.Task))
				continue
			}
			later = append(later, g)
		}
		// An end refused with the events it shared a transaction with
		// goes in the next round: not a conflict, so not a try. Each
		// refusal answers a group's events, so the rounds are bounded.
		groups = append(later, full...)
	}
}

// placedElsewhere says whether g holds a request not answered yet that
// goes only after a named event (AppendAfter) other than the stream's
// last as this writer knows it. One that names that event needs no read:
// should the stream have moved since, the transaction finds the events'
// place taken, and the round after reads the stream and refuses them.
func (g *group) placedElsewhere() bool {
	for _, r := range g.reqs {
		if r.placed && !r.done && r.after != g.a.last {
			return true
		}
	}
	return false
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
			c, err := decodeChunk(kvs[0].Key, kvs[0].Value)
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
	if g.a.final || g.a.claimEnd {
		w.buildFinal(g)
		return
	}
	a := g.a
	token := a.c.Fence.Token()
	if a.err == nil {
		a.err = a.fenced()
	}
	if a.err != nil {
		g.answer(a.err)
		return
	}
	room := 3 // attempt_lost, attempt_started, an end
	for _, r := range g.reqs {
		room += len(r.events)
	}
	c := chunk{Attempt: a.c.Attempt, Token: token, Events: a.events, Bytes: a.bytes, List: make([]Event, 0, room)}
	seq := a.last
	add := func(typ string, data json.RawMessage, at time.Time) {
		seq++
		c.List = append(c.List, Event{Seq: seq, Attempt: a.c.Attempt, Type: typ, Data: data, Time: at})
	}
	opening := a.lastToken != token
	ended := false // an end was added: the claim's later requests are fenced
	for _, r := range g.reqs {
		r.first, r.last = 0, 0
		if r.done || (r.probe && !a.exists && len(c.List) == 0) {
			continue // answered, or an end of a stream that has no events
		}
		if r.err = a.refusal(r, seq, ended); r.err != nil {
			r.done = true
			continue
		}
		// A write past a cap is refused before anything of it is added:
		// not even the attempt's boundary is written for it.
		n, b, err := w.fits(c, r)
		if err != nil {
			r.err, r.done = err, true
			continue
		}
		if opening && len(c.List) == 0 {
			if a.exists && !ends(a.lastType) {
				add(AttemptLost, ownData{Attempt: a.lastAttempt, Token: a.lastToken}.raw(), r.at)
			}
			add(AttemptStarted, ownData{Attempt: a.c.Attempt, Worker: a.c.Worker, Token: token}.raw(), r.at)
		}
		if n > 0 {
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
			ended = true
		}
	}
	if len(c.List) == 0 {
		g.answer(nil)
		return
	}
	w.ops(g, c)
}

// refusal is why request r of a's chunk cannot go at seq, the stream's
// last event as read with what the chunk adds before r, nil if it can:
// ended, an end was added before it; or it goes only after another event.
func (a *attempt) refusal(r *request, seq int64, ended bool) error {
	switch {
	case ended:
		return fmt.Errorf("%w: claim of task %s token %d: attempt %d ended before this write: it writes no more",
			ErrFenced, a.c.Task, a.c.Fence.Token(), a.c.Attempt)
	case r.placed && seq != r.after:
		return fmt.Errorf("%w: task %s: its last event is %d, not %d", ErrMoved, a.c.Task, seq, r.after)
	}
	return nil
}

// fits returns the events of r and their bytes, or ErrStreamFull when
// chunk c cannot take them: they would take the stream past a cap.
func (w *Writer) fits(c chunk, r *request) (n, b int64, err error) {
	n = int64(len(r.events))
	for _, in := range r.events {
		b += int64(in.size())
	}
	if n > 0 && (c.Events+n > w.lim.MaxEvents || c.Bytes+b > w.lim.MaxBytes) {
		return 0, 0, fmt.Errorf("%w: task %s: %d events of %d bytes would take it past %d events or %d bytes",
			ErrStreamFull, r.a.c.Task, n, b, w.lim.MaxEvents, w.lim.MaxBytes)
	}
	return n, b, nil
}

// fenced says why the attempt's claim may write no more, nil if it may:
// its claim is lost, a later attempt wrote the stream, or its own
// attempt ended (attempt_ended or done is its last event).
func (a *attempt) fenced() error {
	f := a.c.Fence
	token := f.Token()
	switch {
	case f.Err() != nil:
		return fmt.Errorf("%w: claim of task %s token %d: %w", ErrFenced, a.c.Task, token, f.Err())
	case a.lastToken > token:
		return fmt.Errorf("%w: claim of task %s token %d: attempt %d (token %d) has written its stream since",
			ErrFenced, a.c.Task, token, a.lastAttempt, a.lastToken)
	case a.lastToken == token && ends(a.lastType):
		return fmt.Errorf("%w: claim of task %s token %d: attempt %d ended (%s): it writes no more",
			ErrFenced, a.c.Task, token, a.lastAttempt, a.lastType)
	}
	return nil
}

// buildFinal makes the chunk of a task's Done (Finish), or of the end
// of an attempt whose claim is gone (Ended: only when that claim wrote
// the stream's last events and they do not end): after the stream's
// last event, as the attempt that wrote it, fenced by the stream alone
// (the request's claimGone).
func (w *Writer) buildFinal(g *group) {
	a := g.a
	r := g.reqs[0]
	notOwn := a.claimEnd && (a.lastToken != a.endOf || ends(a.lastType))
	if !a.exists || a.lastType == Done || r.done || notOwn {
		g.answer(nil)
		return
	}
	var d ownData
	_ = json.Unmarshal(r.end.Data, &d)
	d.Attempt = a.lastAttempt
	c := chunk{Attempt: a.lastAttempt, Token: a.lastToken, Events: a.events, Bytes: a.bytes}
	c.List = []Event{{Seq: a.last + 1, Attempt: a.lastAttempt, Type: r.end.Type, Data: d.raw(), Time: r.at}}
	r.first, r.last = a.last+1, a.last+1
	w.ops(g, c)
}

// ops sets the part of the batch that writes chunk c of g's stream.
func (w *Writer) ops(g *group, c chunk) {
	a := g.a
	first, last := a.last+1, c.List[len(c.List)-1].Seq
	if a.prefix == "" {
		a.prefix = w.keys.StreamChunks(a.c.Task)
	}
	key, start, end := chunkRange(a.prefix, first, last)
	kvs := make([][]byte, 2, 6)
	kvs[0], kvs[1] = key, c.encode()
	now := w.now()
	if !a.exists {
		kvs = append(kvs, []byte(keyspace.TimedKey(w.keys.StreamExpiries(), now.Add(w.lim.MaxAge).UnixNano(), a.c.Task)), nil)
	}
	if c.List[len(c.List)-1].Type == Done {
		kvs = append(kvs, []byte(keyspace.TimedKey(w.keys.StreamExpiries(), now.Add(w.lim.Retention).UnixNano(), a.c.Task)), nil)
	}
	claim, claimPB := a.claim()
	for _, r := range g.reqs {
		if r.claimGone && !r.done {
			claim, claimPB = nil, nil // the attempt's outcome ended its claim: no later attempt wrote (free) is the fence
		}
	}
	// One level: the claim's compares and the stream's together (a
	// nested level per stream cost etcd a request, a decode and an apply
	// of its own, a thousand times a transaction). Which one failed is
	// asked only when one did (claimsHold).
	g.part.set(claimPB, start, end, kvs...)
	g.claim = claim
	g.written, g.first = c, first
}

// commit sends the groups' operations in one transaction, and returns
// the groups to try again: again, another writer of their claim wrote
// first; full, the store-full guard refused their events and their end
// is left to write.
// etcd takes at most 128 operations a transaction level (its default
// --max-txn-ops), less those of the levels above, so the streams go in
// parts of streamsPerTxn, each part one nested transaction.
func (w *Writer) commit(ctx context.Context, groups []*group) (again, full []*group) {
	var parts [][]*group
	for i := 0; i < len(groups); i += streamsPerTxn {
		parts = append(parts, groups[i:min(i+streamsPerTxn, len(groups))])
	}
	if len(parts) == 0 {
		return nil, nil
	}
	w.txns.Add(1)
	// New events, and a stream's first chunk, grow the store: they go
	// only while the store-full guard key is absent (storeguard). Ends
	// of streams that have events are let through: see storeFull.
	resp, err := w.sendParts(ctx, parts, slices.ContainsFunc(groups, (*group).grows))
	if err == nil && !resp.Succeeded {
		if err = storeguard.FromRange(resp.Responses[0].GetResponseRange()); err == nil {
			err = fmt.Errorf("stream: write the streams' events: the store-full guard refused them, and its key is gone: %w", drover.ErrStoreFull)
		}
	}
	if errors.Is(err, drover.ErrStoreFull) { // nothing was written
		return nil, storeFull(groups, err)
	}
	if err != nil {
		for _, g := range groups {
			g.a.known = false // it may have been written: read again
			g.answer(fmt.Errorf("stream: write task %s's events: %w", g.a.c.Task, err))
		}
		return nil, nil
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
	return w.refused(ctx, failed), nil
}

// grows says whether g's write holds events (not only an end), or
// makes its stream (a first chunk, an expiry key): it grows the store,
// so the store-full guard holds it back.
func (g *group) grows() bool {
	if !g.a.exists {
		return true
	}
	for _, r := range g.reqs {
		if !r.done && len(r.events) > 0 {
			return true
		}
	}
	return false
}

// storeFull answers the event writes of groups, refused by the
// store-full guard, with err (a *drover.StoreFullError), and returns the
// groups that also hold an end of a stream that has events, to be
// written without their events. Such an end (attempt_ended, done) is
// let through a full store: there is one an attempt and one a task, so
// they are bounded by the tasks already stored (none is added while the
// store is full), and each is one small event; without it, its
// followers would wait for the stream's end until its retention. An end
// of a stream without events (every event of the attempt was refused)
// is not written, as an end of an attempt that emitted nothing: it
// would make the stream (its attempt_started, its expiry key).
// Nothing was written, so what the attempts know of their streams
// (a.known and the rest) still holds: they are not read again.
func storeFull(groups []*group, err error) (again []*group) {
	for _, g := range groups {
		left := false
		for _, r := range g.reqs {
			switch {
			case r.done:
			case len(r.events) > 0:
				r.err, r.done, r.first, r.last = err, true, 0, 0
			case !g.a.exists:
				r.done, r.first, r.last = true, 0, 0 // an end of no events: nothing to close
			default:
				left = true
			}
		}
		if left {
			again = append(again, g)
		} else {
			g.done = true
		}
	}
	return again
}

// wrote applies a write of g that succeeded to its attempt.
func (w *Writer) wrote(g *group) {
	a, c := g.a, g.written
	ev := c.List[len(c.List)-1]
	a.exists, a.last, a.events, a.bytes = true, ev.Seq, c.Events, c.Bytes
	a.lastToken, a.lastAttempt, a.lastType = c.Token, c.Attempt, ev.Type
	for _, r := range g.reqs {
		if !r.done && r.end != nil && r.last == ev.Seq {
			r.stored = chunk{Attempt: c.Attempt, Token: c.Token, Events: c.Events, Bytes: c.Bytes, List: c.List[len(c.List)-1:]}
		}
	}
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
