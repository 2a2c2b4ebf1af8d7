package agentserver

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/schedule"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cronSweepPage is how many crons one read of a sweep answers.
const cronSweepPage = 100

// sweepCrons makes the schedule of every cron of s's namespace as its
// record says (repairSchedule), reading the crons a page at a time: a
// server that died between a cron's record and its schedule leaves a
// schedule missing or stale until then. A record that does not decode is
// left to the reads that refuse it.
func (s *server) sweepCrons(ctx context.Context) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	var sc *schedule.Client // made once a cron is found: most namespaces have none
	from, end := sp.AgentCrons(), clientv3.GetPrefixRangeEnd(sp.AgentCrons())
	for {
		resp, err := s.cfg.Etcd.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(cronSweepPage))
		if err != nil {
			return etcdError("reading the crons", err)
		}
		if sc == nil && len(resp.Kvs) > 0 {
			c, done, err := s.schedules(ctx)
			if err != nil {
				return err
			}
			defer done()
			sc = c
		}
		for _, kv := range resp.Kvs {
			var c Cron
			if json.Unmarshal(kv.Value, &c) != nil {
				continue
			}
			if _, err := s.repairSchedule(ctx, sc, sp, c, kv.ModRevision); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// repairSchedule makes cron c's schedule (c read at revision rev) as its
// record says, then reads the record again: one changed meanwhile (an
// update whose own schedule write came before this one, which made it
// as the older record said) is made again, and one deleted meanwhile has
// its schedule deleted.
func (s *server) repairSchedule(ctx context.Context, sc *schedule.Client, sp keyspace.Space, c Cron, rev int64) (schedule.Schedule, error) {
	for range maxAttempts {
		sch, err := syncSchedule(ctx, sc, c)
		if err != nil {
			return schedule.Schedule{}, s.scheduleError("making the cron's schedule", err)
		}
		g, err := s.cfg.Etcd.Get(ctx, sp.AgentCron(c.CronID))
		if err != nil {
			return schedule.Schedule{}, etcdError("reading the cron", err)
		}
		if len(g.Kvs) == 0 {
			if err := sc.Delete(ctx, cronScheduleName(c.CronID)); err != nil && !errors.Is(err, schedule.ErrNotFound) {
				return schedule.Schedule{}, s.scheduleError("deleting the schedule of a cron gone", err)
			}
			return sch, nil
		}
		if g.Kvs[0].ModRevision == rev {
			return sch, nil
		}
		if err := json.Unmarshal(g.Kvs[0].Value, &c); err != nil {
			return schedule.Schedule{}, undecodable("cron", c.CronID, err)
		}
		rev = g.Kvs[0].ModRevision
	}
	return schedule.Schedule{}, errRaced("the cron's schedule")
}
