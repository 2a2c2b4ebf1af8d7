package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/schedule"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// CronsQueue is the queue of the namespace that carries crons' fires: a
// cron is a schedule (package schedule) whose each tick submits one task
// of this queue, of type CronTaskType, with the cron's id; the server's
// CronRunner claims it and creates the fire's run.
const CronsQueue = "langgraph-crons"

// CronTaskType is the type of a cron's fire tasks.
const CronTaskType = "cron"

// cronSchedulePrefix starts the name of a cron's schedule: the rest is
// the cron's id.
const cronSchedulePrefix = "agent-cron-"

// Cron is a cron of LangGraph's Agent Server: a run made on a schedule,
// on its thread or (without one) on a new thread each time. Its fields
// and their JSON are LangGraph's.
type Cron struct {
	CronID         string         `json:"cron_id"`
	AssistantID    string         `json:"assistant_id"`
	ThreadID       *string        `json:"thread_id"`
	OnRunCompleted string         `json:"on_run_completed,omitempty" doc:"A cron without a thread: keep (the default) each run's thread."`
	EndTime        *time.Time     `json:"end_time"`
	Schedule       string         `json:"schedule" doc:"A cron expression of five fields, read in timezone."`
	Timezone       *string        `json:"timezone"`
	CreatedAt      time.Time      `json:"created_at"`
	UpdatedAt      time.Time      `json:"updated_at"`
	Payload        map[string]any `json:"payload" doc:"The run each fire creates: its input, config, context, metadata and options."`
	UserID         *string        `json:"user_id"`
	NextRunDate    *time.Time     `json:"next_run_date" doc:"When it fires next; null while disabled."`
	Metadata       map[string]any `json:"metadata"`
	Enabled        bool           `json:"enabled"`
}

func errCronNotFound(id string) error {
	return huma.NewError(http.StatusNotFound, fmt.Sprintf("Cron with ID %s not found", id))
}

// cronScheduleName is the name of cron id's schedule.
func cronScheduleName(id string) string { return cronSchedulePrefix + id }

// cronSpec is the schedule of cron c.
func cronSpec(c Cron) schedule.Schedule {
	params, _ := json.Marshal(map[string]string{"cron_id": c.CronID})
	tz := ""
	if c.Timezone != nil {
		tz = *c.Timezone
	}
	// Overlap is the run's business (its multitask strategy on the
	// thread), so every tick fires; a missed tick fires once, late, as
	// LangGraph fires a cron whose next run date has passed.
	return schedule.Schedule{Name: cronScheduleName(c.CronID), Cron: c.Schedule, TZ: tz, Queue: CronsQueue, Type: CronTaskType,
		Params: params, Overlap: schedule.Allow, Catchup: schedule.Latest, Paused: !c.Enabled}
}

// scheduleInput is the 400 of a schedule the schedule package refused,
// named by the body's field.
func scheduleInput(err error) error {
	var ie *drover.InputError
	if !errors.As(err, &ie) {
		return err
	}
	loc := map[string]string{"cron": "body.schedule", "tz": "body.timezone"}[ie.Field]
	if loc == "" {
		loc = "body." + ie.Field
	}
	return badInput(loc, ie.Value, ie.Rule)
}

// schedules is a schedule client of the request's namespace, and its
// queue client to close after.
func (s *server) schedules(ctx context.Context) (*schedule.Client, func(), error) {
	q, err := s.queueOf(ctx)
	if err != nil {
		return nil, nil, err
	}
	c, err := schedule.New(schedule.Config{Etcd: s.cfg.Etcd, Namespace: s.cfg.Namespace(ctx), Queue: q, Now: s.cfg.Now})
	if err != nil {
		closeQueue(q)
		return nil, nil, huma.NewError(http.StatusInternalServerError, "agentserver: "+err.Error())
	}
	return c, func() { closeQueue(q) }, nil
}

// getCron reads cron id and its revision; 404 when there is none.
func (s *server) getCron(ctx context.Context, id string) (Cron, int64, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Cron{}, 0, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentCron(id))
	if err != nil {
		return Cron{}, 0, etcdError("reading the cron", err)
	}
	if len(resp.Kvs) == 0 {
		return Cron{}, 0, errCronNotFound(id)
	}
	var c Cron
	if err := json.Unmarshal(resp.Kvs[0].Value, &c); err != nil {
		return Cron{}, 0, undecodable("cron", id, err)
	}
	return c, resp.Kvs[0].ModRevision, nil
}

// createCron stores cron c and its schedule: the cron first, in one
// transaction that compares its absence and the store guard, then its
// schedule, which the cron's record is the truth of: a schedule the
// queue refuses takes the cron back, and a server that dies between the
// two leaves a cron whose schedule the next search or sweep makes
// (repairSchedule).
// Bad input stores nothing.
func (s *server) createCron(ctx context.Context, c Cron) (Cron, error) {
	spec := cronSpec(c)
	if err := spec.Validate(); err != nil {
		return Cron{}, scheduleInput(err)
	}
	sp, err := s.space(ctx)
	if err != nil {
		return Cron{}, err
	}
	sc, done, err := s.schedules(ctx)
	if err != nil {
		return Cron{}, err
	}
	defer done()
	raw, _ := json.Marshal(c)
	key := sp.AgentCron(c.CronID)
	// The namespace is marked as one with schedules with the record, as
	// a schedule's create marks it: the cron runners' sweep then finds
	// the cron even when its schedule never came.
	mark := keyspace.ScheduleNamespace(s.cfg.Namespace(ctx))
	resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), storeguard.NotFull(sp)).
		Then(clientv3.OpPut(key, string(raw)), clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(mark), "=", 0)}, []clientv3.Op{clientv3.OpPut(mark, "")}, nil)).
		Else(storeguard.GetOp(sp)).Commit()
	if err != nil {
		return Cron{}, etcdError("creating the cron", err)
	}
	if !resp.Succeeded {
		if err := guardOf(resp, 0); err != nil {
			return Cron{}, err
		}
		return Cron{}, huma.NewError(http.StatusConflict, "Cron "+c.CronID+" already exists")
	}
	sch, err := syncSchedule(ctx, sc, c)
	if err != nil {
		var ie *drover.InputError
		if errors.As(err, &ie) || errors.Is(err, drover.ErrStoreFull) { // refused: take the cron back
			_, _ = s.cfg.Etcd.Txn(context.WithoutCancel(ctx)).If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Header.Revision)).
				Then(clientv3.OpDelete(key)).Commit()
		}
		return Cron{}, s.scheduleError("creating the cron's schedule", err)
	}
	withNext(&c, sch)
	return c, nil
}

// syncSchedule makes cron c's schedule as its record says (when it
// fires, paused while disabled): created when it is missing, updated when
// it differs, and answers it.
func syncSchedule(ctx context.Context, sc *schedule.Client, c Cron) (schedule.Schedule, error) {
	spec := cronSpec(c)
	for range maxAttempts {
		sch, err := sc.Get(ctx, spec.Name)
		switch {
		case errors.Is(err, schedule.ErrNotFound):
			sch, err = sc.Create(ctx, spec)
			if errors.Is(err, schedule.ErrExists) { // made meanwhile by another read
				continue
			}
			return sch, err
		case err != nil:
			return schedule.Schedule{}, err
		case sch.Cron == spec.Cron && sch.TZ == spec.TZ && sch.Paused == spec.Paused:
			return sch, nil
		}
		return sc.Update(ctx, spec.Name, func(old *schedule.Schedule) {
			old.Cron, old.TZ, old.Paused = spec.Cron, spec.TZ, spec.Paused
		})
	}
	return schedule.Schedule{}, errRaced("the cron's schedule")
}

// scheduleError is the problem of a schedule call that failed.
func (s *server) scheduleError(doing string, err error) error {
	var ie *drover.InputError
	switch {
	case errors.As(err, &ie):
		return scheduleInput(err)
	case errors.Is(err, drover.ErrStoreFull):
		return storeFull(err)
	case errors.Is(err, schedule.ErrExists):
		return huma.NewError(http.StatusConflict, doing+": "+err.Error())
	}
	return etcdError(doing, err)
}

// withNext sets c's next run date from its schedule.
func withNext(c *Cron, sch schedule.Schedule) {
	c.NextRunDate = nil
	if !sch.NextFireAt.IsZero() && !sch.Paused {
		t := sch.NextFireAt.UTC()
		c.NextRunDate = &t
	}
}

// cronPatch is what an update changes: the fields given.
type cronPatch struct {
	Schedule *string
	Timezone *string
	EndTime  *time.Time
	ClearEnd bool
	Enabled  *bool
	Metadata map[string]any
	Payload  map[string]any
}

// updateCron applies p to cron id, then makes its schedule as the cron
// says: the cron's record is the truth, so a server that dies between
// the two leaves a schedule its next read corrects (a fire obeys the
// record's enabled and end_time meanwhile). A cron that raced another
// change is read and patched again.
func (s *server) updateCron(ctx context.Context, id string, p cronPatch) (Cron, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Cron{}, err
	}
	sc, done, err := s.schedules(ctx)
	if err != nil {
		return Cron{}, err
	}
	defer done()
	for range maxAttempts {
		c, rev, err := s.getCron(ctx, id)
		if err != nil {
			return Cron{}, err
		}
		applyPatch(&c, p)
		c.UpdatedAt = s.now()
		if err := cronSpec(c).Validate(); err != nil {
			return Cron{}, scheduleInput(err)
		}
		raw, _ := json.Marshal(c)
		resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(sp.AgentCron(id)), "=", rev), storeguard.NotFull(sp)).
			Then(clientv3.OpPut(sp.AgentCron(id), string(raw))).Else(storeguard.GetOp(sp)).Commit()
		if err != nil {
			return Cron{}, etcdError("updating the cron", err)
		}
		if !resp.Succeeded {
			if err := guardOf(resp, 0); err != nil {
				return Cron{}, err
			}
			continue
		}
		sch, err := syncSchedule(ctx, sc, c)
		if err != nil {
			return Cron{}, s.scheduleError("updating the cron's schedule", err)
		}
		withNext(&c, sch)
		return c, nil
	}
	return Cron{}, errRaced("the cron")
}

func applyPatch(c *Cron, p cronPatch) {
	if p.Schedule != nil {
		c.Schedule = strings.TrimSpace(*p.Schedule)
	}
	if p.Timezone != nil {
		c.Timezone = p.Timezone
		if *p.Timezone == "" {
			c.Timezone = nil
		}
	}
	if p.EndTime != nil {
		t := p.EndTime.UTC()
		c.EndTime = &t
	} else if p.ClearEnd {
		c.EndTime = nil
	}
	if p.Enabled != nil {
		c.Enabled = *p.Enabled
	}
	if p.Metadata != nil {
		c.Metadata = p.Metadata
	}
	for k, v := range p.Payload {
		if c.Payload == nil {
			c.Payload = map[string]any{}
		}
		c.Payload[k] = v
	}
}

// deleteCron deletes cron id, then its schedule; 404 when there is none.
// A fire of the schedule in flight finds no cron and makes no run.
func (s *server) deleteCron(ctx context.Context, id string) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	key := sp.AgentCron(id)
	resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), ">", 0)).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return etcdError("deleting the cron", err)
	}
	if !resp.Succeeded {
		return errCronNotFound(id)
	}
	sc, done, err := s.schedules(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := sc.Delete(ctx, cronScheduleName(id)); err != nil && !errors.Is(err, schedule.ErrNotFound) {
		return etcdError("deleting the cron's schedule", err)
	}
	return nil
}

// cronFilter is what a cron search or count matches.
type cronFilter struct {
	AssistantID string         `json:"assistant_id,omitempty" doc:"Only crons of this assistant."`
	ThreadID    string         `json:"thread_id,omitempty" doc:"Only crons of this thread."`
	Enabled     *bool          `json:"enabled,omitempty" doc:"Only crons enabled (true) or disabled (false)."`
	Metadata    map[string]any `json:"metadata,omitempty" doc:"Only crons whose metadata contains this."`
}

func (f cronFilter) match(c Cron) bool {
	return (f.AssistantID == "" || c.AssistantID == f.AssistantID) &&
		(f.ThreadID == "" || (c.ThreadID != nil && *c.ThreadID == f.ThreadID)) &&
		(f.Enabled == nil || c.Enabled == *f.Enabled) &&
		(f.Metadata == nil || contains(map[string]any(c.Metadata), map[string]any(f.Metadata)))
}

// listCrons returns the crons f matches, sorted by field by (created_at
// when "") in order ("desc" when ""), their next run dates as their
// schedules have them.
func (s *server) listCrons(ctx context.Context, f cronFilter, by, order string) ([]Cron, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentCrons(), clientv3.WithPrefix())
	if err != nil {
		return nil, etcdError("listing crons", err)
	}
	var found []listed[Cron]
	for _, kv := range resp.Kvs {
		var c Cron
		if err := json.Unmarshal(kv.Value, &c); err != nil {
			return nil, undecodable("cron", idOf(kv.Key), err)
		}
		if f.match(c) {
			found = append(found, listed[Cron]{c, kv.CreateRevision, kv.ModRevision})
		}
	}
	if len(found) > 0 {
		if err := s.withNextRuns(ctx, found); err != nil {
			return nil, err
		}
	}
	return sorted(found, order, func(l listed[Cron]) string {
		switch by {
		case "cron_id":
			return l.v.CronID
		case "assistant_id":
			return l.v.AssistantID + revKey(l.createRev)
		case "thread_id":
			return derefOr(l.v.ThreadID) + revKey(l.createRev)
		case "updated_at":
			return sortTime(l.v.UpdatedAt) + revKey(l.modRev)
		case "next_run_date":
			if l.v.NextRunDate == nil {
				return "~" + revKey(l.createRev)
			}
			return sortTime(*l.v.NextRunDate) + revKey(l.createRev)
		}
		return sortTime(l.v.CreatedAt) + revKey(l.createRev)
	}), nil
}

// withNextRuns sets the next run dates of crons from their schedules,
// making a schedule that is missing or differs from its cron's record
// (its server died between the two writes) as the record says.
func (s *server) withNextRuns(ctx context.Context, crons []listed[Cron]) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	sc, done, err := s.schedules(ctx)
	if err != nil {
		return err
	}
	defer done()
	all, err := sc.List(ctx)
	if err != nil {
		return etcdError("reading the crons' schedules", err)
	}
	by := make(map[string]schedule.Schedule, len(all))
	for _, sch := range all {
		by[sch.Name] = sch
	}
	for i := range crons {
		c := &crons[i].v
		sch, ok := by[cronScheduleName(c.CronID)]
		if spec := cronSpec(*c); !ok || sch.Cron != spec.Cron || sch.TZ != spec.TZ || sch.Paused != spec.Paused {
			if sch, err = s.repairSchedule(ctx, sc, sp, *c, crons[i].modRev); err != nil {
				return err
			}
		}
		withNext(c, sch)
	}
	return nil
}

func derefOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// dropThreadCrons deletes the crons of thread, which is gone (a fire
// that finds its thread gone would delete its cron too).
func (s *server) dropThreadCrons(ctx context.Context, thread string) error {
	list, err := s.listCrons(ctx, cronFilter{ThreadID: thread}, "", "")
	if err != nil {
		return err
	}
	for _, c := range list {
		if err := s.dropCron(ctx, c.CronID); err != nil {
			return err
		}
	}
	return nil
}
