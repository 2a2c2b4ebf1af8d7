package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An outcome of a task in a segment is fenced and recorded from the keys
// of its run alone: the run whose key's create revision is the token says
// that the claim holds (and under which lease), which attempt runs and
// which slots the run holds; the run's own outcome keys and the segment's
// exits say which of them have finished. The segment's tasks are not read
// to write an outcome (only to answer with the task: from the client's
// cache, which the claim filled).

// segGroup is the outcomes of a Report for the tasks of one segment, and
// what the last read saw of the segment's runs.
type segGroup struct {
	q, seg string
	items  []int         // the outcomes (indexes into Report's)
	slots  map[int]int   // each outcome's slot
	tok    map[int]int64 // each outcome's token
	// The read:
	rev   int64
	runs  []leasedRun
	done  map[int64]map[int]bool // per run (token), its slots with an outcome
	exits map[int]bool
	fifo  bool
	tasks []Task // the segment's tasks, once needed
	// cached is the run the group was made of from memory (claimcache.go),
	// byslot the tasks of its slots as claimed; nil when read.
	cached *cachedRun
	byslot map[int]Task
}

// leasedRun is a run as read, with its lease.
type leasedRun struct {
	runRef
	lease int64
}

// runWrite is the outcomes of one run to write, and the outcome of each.
type runWrite struct {
	g      *segGroup
	run    *segRun
	w      *Worker
	os     []outcome
	items  []int
	slots  []int // the run's slots
	final  bool
	others bool // the segment had runs, as read, that this write does not end
}

// reportSegments records the outcomes of groups, reading them again when
// another outcome of one of their runs got in first.
func (c *Client) reportSegments(ctx context.Context, os []Outcome, groups []*segGroup, out []Reported) {
	for try := 0; len(groups) > 0; try++ {
		if try == 20 {
			for _, g := range groups {
				for _, i := range g.items {
					out[i].Err = fmt.Errorf("queue: report task %s: the other outcomes of its claim kept changing; try again", os[i].ID)
				}
			}
			return
		}
		if try > 0 {
			sleepCtx(ctx, time.Duration(rand.Int64N(int64(5*time.Millisecond))))
		}
		if err := c.readRuns(ctx, groups); err != nil {
			for _, g := range groups {
				for _, i := range g.items {
					out[i].Err = err
				}
			}
			return
		}
		var writes []*runWrite
		for _, g := range groups {
			writes = append(writes, c.runWrites(ctx, g, os, out)...)
		}
		groups = c.writeRuns(ctx, writes, out)
	}
}

// readRuns reads, for each group, its segment's runs and exits, the
// outcome keys of the runs its outcomes name, and its queue's config.
func (c *Client) readRuns(ctx context.Context, groups []*segGroup) error {
	var ops []clientv3.Op
	var part []*segGroup
	flush := func() error {
		if len(part) == 0 {
			return nil
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("queue: read the runs of segment %s of %s: %w", part[0].seg, part[0].q, err)
		}
		rs := resp.Responses
		for _, g := range part {
			n := 3 + len(g.tokens())
			g.parseRuns(c, resp.Header.Revision, rs[:n])
			rs = rs[n:]
		}
		ops, part = ops[:0], part[:0]
		return nil
	}
	for _, g := range groups {
		more := []clientv3.Op{
			clientv3.OpGet(c.keys.Runs(g.q, g.seg), clientv3.WithPrefix()),
			clientv3.OpGet(c.keys.Exits(g.q, g.seg), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(c.keys.QueueConfig(g.q)),
		}
		for _, tok := range g.tokens() {
			more = append(more, clientv3.OpGet(runOuts(c.keys, g.q, g.seg, tok), clientv3.WithPrefix()))
		}
		if len(ops)+len(more) > 120 {
			if err := flush(); err != nil {
				return err
			}
		}
		ops, part = append(ops, more...), append(part, g)
	}
	return flush()
}

// runOuts is the prefix of the outcome keys of the run with token tok.
func runOuts(keys keyspace.Space, q, seg string, tok int64) string {
	return keys.Outs(q, seg) + fmt.Sprintf("%019d-", tok)
}

// tokens are the tokens g's outcomes name, in order, once each.
func (g *segGroup) tokens() []int64 {
	var out []int64
	for _, i := range g.items {
		if tok := g.token(i); !slices.Contains(out, tok) {
			out = append(out, tok)
		}
	}
	return out
}

// token is outcome i's token.
func (g *segGroup) token(i int) int64 { return g.tok[i] }

// parseRuns reads the responses of readRuns for g.
func (g *segGroup) parseRuns(c *Client, rev int64, rs []*pb.ResponseOp) {
	g.rev, g.runs, g.exits, g.done = rev, nil, map[int]bool{}, map[int64]map[int]bool{}
	pre := c.keys.Runs(g.q, g.seg)
	for _, kv := range rs[0].GetResponseRange().Kvs {
		v, err := taskstore.DecodeRun(kv.Value)
		if err != nil || len(v.Attempts) != len(v.Slots) {
			continue
		}
		g.runs = append(g.runs, leasedRun{runRef{key: string(kv.Key), rest: strings.TrimPrefix(string(kv.Key), pre), token: kv.CreateRevision, v: v}, kv.Lease})
	}
	for _, kv := range rs[1].GetResponseRange().Kvs {
		if s, _, ok := keyspace.ParseExit(strings.TrimPrefix(string(kv.Key), c.keys.Exits(g.q, g.seg))); ok {
			g.exits[s] = true
		}
	}
	var cfg Config
	if kvs := rs[2].GetResponseRange().Kvs; len(kvs) == 1 {
		_ = json.Unmarshal(kvs[0].Value, &cfg)
	}
	g.fifo = cfg.FIFO
	for j, tok := range g.tokens() {
		done := map[int]bool{}
		for _, kv := range rs[3+j].GetResponseRange().Kvs {
			o, err := taskstore.DecodeOut(kv.Value)
			if err != nil {
				continue
			}
			for _, s := range o.OK {
				done[s.Slot] = true
			}
			for _, s := range o.Moved {
				done[s] = true
			}
		}
		g.done[tok] = done
	}
}
