package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

// ScheduleBody is a schedule: when it fires and the task each fire submits.
type ScheduleBody struct {
	Name          string          `json:"name" doc:"The schedule's name: 1 to 100 letters, digits, '.', '_', '-' or ':'."`
	Cron          string          `json:"cron,omitempty" doc:"Cron expression: five fields (minute hour day-of-month month day-of-week) or a descriptor such as @daily. Give cron or every."`
	TZ            string          `json:"tz,omitempty" doc:"IANA time zone the cron expression is read in (default UTC); daylight saving time follows it."`
	Every         string          `json:"every,omitempty" doc:"Fire at each multiple of this interval since the Unix epoch: a Go duration of whole seconds, 1s or more."`
	Queue         string          `json:"queue" doc:"The queue each fire submits to."`
	Type          string          `json:"type" doc:"The task type each fire submits."`
	Params        json.RawMessage `json:"params,omitempty" doc:"The task's parameters: any JSON value."`
	Overlap       string          `json:"overlap" doc:"While the previous fire's task has not finished: skip, allow, buffer-one or cancel-previous." enum:"skip,allow,buffer-one,cancel-previous"`
	Catchup       string          `json:"catchup" doc:"Ticks missed while no server ran: none, latest or all." enum:"none,latest,all"`
	CatchupWindow string          `json:"catchup_window" doc:"How far back missed ticks fire (Go duration)."`
	Jitter        string          `json:"jitter,omitempty" doc:"Each fire is delayed by up to this much, the same on every server (Go duration)."`
	Paused        bool            `json:"paused" doc:"A paused schedule does not fire (a trigger still does)."`
	NextFireAt    *time.Time      `json:"next_fire_at,omitempty" doc:"When it fires next, jitter included; absent while paused."`
}

func scheduleBodyOf(s schedule.Schedule) ScheduleBody {
	b := ScheduleBody{Name: s.Name, Cron: s.Cron, TZ: s.TZ, Queue: s.Queue, Type: s.Type, Params: s.Params,
		Overlap: string(s.Overlap), Catchup: string(s.Catchup), CatchupWindow: time.Duration(s.CatchupWindow).String(), Paused: s.Paused}
	if s.Every != 0 {
		b.Every = time.Duration(s.Every).String()
	}
	if s.Jitter != 0 {
		b.Jitter = time.Duration(s.Jitter).String()
	}
	if !s.NextFireAt.IsZero() {
		t := s.NextFireAt.UTC()
		b.NextFireAt = &t
	}
	return b
}

// ScheduleFields are a schedule's settable fields; nil: not given.
type ScheduleFields struct {
	Cron          *string         `json:"cron,omitempty" doc:"Cron expression: five fields (minute hour day-of-month month day-of-week) or a descriptor such as @daily. Give cron or every."`
	TZ            *string         `json:"tz,omitempty" doc:"IANA time zone the cron expression is read in (default UTC)."`
	Every         *string         `json:"every,omitempty" doc:"Fire at each multiple of this interval since the Unix epoch: a Go duration of whole seconds, 1s or more."`
	Queue         *string         `json:"queue,omitempty" doc:"The queue each fire submits to."`
	Type          *string         `json:"type,omitempty" doc:"The task type each fire submits."`
	Params        json.RawMessage `json:"params,omitempty" doc:"The task's parameters: any JSON value."`
	Overlap       *string         `json:"overlap,omitempty" doc:"skip (default), allow, buffer-one or cancel-previous."`
	Catchup       *string         `json:"catchup,omitempty" doc:"none, latest (default) or all."`
	CatchupWindow *string         `json:"catchup_window,omitempty" doc:"How far back missed ticks fire (Go duration, default 1h)."`
	Jitter        *string         `json:"jitter,omitempty" doc:"Delay each fire by up to this much (Go duration)."`
	Paused        *bool           `json:"paused,omitempty" doc:"Create or set the schedule paused."`
}

// apply sets the fields given on s; an unreadable duration is a 400, and
// then s is left as it was: every field is read before any is set.
func (f *ScheduleFields) apply(s *schedule.Schedule) error {
	dur := func(field string, v *string, to *queue.Duration) error {
		if v == nil {
			return nil
		}
		d, err := time.ParseDuration(*v)
		if err != nil {
			return invalid("body."+field, *v, "must be a Go duration such as 30s or 1h")
		}
		*to = queue.Duration(d)
		return nil
	}
	every, window, jitter := s.Every, s.CatchupWindow, s.Jitter
	for _, err := range []error{dur("every", f.Every, &every), dur("catchup_window", f.CatchupWindow, &window), dur("jitter", f.Jitter, &jitter)} {
		if err != nil {
			return err
		}
	}
	str := func(v *string, to *string) {
		if v != nil {
			*to = *v
		}
	}
	str(f.Cron, &s.Cron)
	str(f.TZ, &s.TZ)
	str(f.Queue, &s.Queue)
	str(f.Type, &s.Type)
	if f.Overlap != nil {
		s.Overlap = schedule.Overlap(*f.Overlap)
	}
	if f.Catchup != nil {
		s.Catchup = schedule.Catchup(*f.Catchup)
	}
	if f.Params != nil {
		s.Params = f.Params
	}
	if f.Paused != nil {
		s.Paused = *f.Paused
	}
	if f.Cron != nil && f.Every == nil {
		s.Every = 0
	}
	if f.Every != nil && f.Cron == nil {
		s.Cron = ""
		if f.TZ == nil {
			s.TZ = ""
		}
	}
	if f.Every != nil {
		s.Every = every
	}
	s.CatchupWindow, s.Jitter = window, jitter
	return nil
}

// scheduleWhere maps the schedule's field names to the request's.
var scheduleWhere = map[string]string{"name": "body.name", "cron": "body.cron", "tz": "body.tz", "every": "body.every", "queue": "body.queue",
	"type": "body.type", "params": "body.params", "overlap": "body.overlap", "catchup": "body.catchup",
	"catchup_window": "body.catchup_window", "jitter": "body.jitter"}

type createScheduleInput struct {
	Body struct {
		Name string `json:"name" doc:"The schedule's name: 1 to 100 letters, digits, '.', '_', '-' or ':'."`
		ScheduleFields
	}
}

type schedulePath struct {
	Name string `path:"name" doc:"The schedule's name."`
}

type patchScheduleInput struct {
	Name string `path:"name" doc:"The schedule's name."`
	Body ScheduleFields
}

type historyInput struct {
	Name  string `path:"name" doc:"The schedule's name."`
	Limit int    `query:"limit" default:"100" minimum:"1" maximum:"1000" doc:"Most fires returned, newest first."`
}

// FireBody is one fire of a schedule.
type FireBody struct {
	NominalTime time.Time  `json:"nominal_time" doc:"The tick's time (a trigger's: when it was asked)."`
	SubmittedAt *time.Time `json:"submitted_at,omitempty" doc:"When its task was submitted; absent when none was (SKIPPED, REJECTED)."`
	TaskID      string     `json:"task_id,omitempty" doc:"The task's id: the schedule's name and the tick's time."`
	Outcome     string     `json:"outcome" doc:"The task's state now (PENDING, RUNNING, SUCCEEDED, ...), SKIPPED (overlap), MISSED (ticks that passed without a fire: count of them), REJECTED (by the queue, with the reason), REMOVED (after its retention) or STOPPED (its timing no longer reads, with the reason; it fires again once updated)."`
	Manual      bool       `json:"manual,omitempty" doc:"A trigger's fire."`
	Count       int        `json:"count,omitempty" doc:"MISSED: how many ticks passed without a fire, from nominal_time to last_time."`
	LastTime    *time.Time `json:"last_time,omitempty" doc:"MISSED: the last of the ticks that passed without a fire."`
}

func fireBodyOf(f schedule.Fire) FireBody {
	b := FireBody{NominalTime: f.NominalTime.UTC(), TaskID: f.TaskID, Outcome: f.Outcome, Manual: f.Manual, Count: f.Count}
	if !f.LastTime.IsZero() {
		t := f.LastTime.UTC()
		b.LastTime = &t
	}
	if !f.SubmittedAt.IsZero() {
		t := f.SubmittedAt.UTC()
		b.SubmittedAt = &t
	}
	return b
}

type scheduleOutput struct{ Body ScheduleBody }

// scheduleProblem is the problem of a schedule's error.
func scheduleProblem(err error) error {
	switch {
	case errors.Is(err, schedule.ErrExists):
		return newProblem(http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, schedule.ErrNotFound):
		return newProblem(http.StatusNotFound, "not-found", err.Error())
	}
	return problem(err, scheduleWhere)
}

// schedules is the schedule client of the request's namespace.
func (s *Server) schedules(ctx context.Context) (*schedule.Client, error) {
	qc, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	c, err := schedule.New(schedule.Config{Etcd: s.cli, Namespace: s.nsOf(ctx), Queue: qc})
	if err != nil {
		return nil, problem(err, nil)
	}
	return c, nil
}

func (s *Server) scheduleRoutes() {
	tags := []string{"schedules"}
	s.scheduleListRoutes(tags)
	s.scheduleChangeRoutes(tags)
	s.scheduleFireRoutes(tags)
}

// scheduleListRoutes: create and list.
func (s *Server) scheduleListRoutes(tags []string) {
	huma.Register(s.api, huma.Operation{
		OperationID: "create-schedule", Method: http.MethodPost, Path: "/v1/schedules", Tags: tags,
		Summary:       "Create a schedule",
		Description:   "As `drover schedules create`. Each tick submits one task, whose id is the name and the tick's time, on whichever server fires it. 409 when the name exists; nothing is stored on an error.",
		DefaultStatus: http.StatusCreated, Errors: []int{http.StatusBadRequest, http.StatusConflict},
	}, func(ctx context.Context, in *createScheduleInput) (*scheduleOutput, error) {
		sc := schedule.Schedule{Name: in.Body.Name}
		if err := in.Body.apply(&sc); err != nil {
			return nil, err
		}
		c, err := s.schedules(ctx)
		if err != nil {
			return nil, err
		}
		out, err := c.Create(ctx, sc)
		if err != nil {
			return nil, scheduleProblem(err)
		}
		return &scheduleOutput{scheduleBodyOf(out)}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "list-schedules", Method: http.MethodGet, Path: "/v1/schedules", Tags: tags,
		Summary: "Every schedule, by name",
	}, func(ctx context.Context, _ *struct{}) (*struct {
		Body struct {
			Data []ScheduleBody `json:"data"`
		}
	}, error) {
		c, err := s.schedules(ctx)
		if err != nil {
			return nil, err
		}
		list, err := c.List(ctx)
		if err != nil {
			return nil, scheduleProblem(err)
		}
		out := &struct {
			Body struct {
				Data []ScheduleBody `json:"data"`
			}
		}{}
		out.Body.Data = make([]ScheduleBody, len(list))
		for i, sc := range list {
			out.Body.Data[i] = scheduleBodyOf(sc)
		}
		return out, nil
	})
}

// scheduleChangeRoutes: get, update, delete, pause and resume.
func (s *Server) scheduleChangeRoutes(tags []string) {
	huma.Register(s.api, huma.Operation{
		OperationID: "get-schedule", Method: http.MethodGet, Path: "/v1/schedules/{name}", Tags: tags,
		Summary: "A schedule and its next fire", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *schedulePath) (*scheduleOutput, error) {
		return s.scheduleDo(ctx, in.Name, func(c *schedule.Client) (schedule.Schedule, error) { return c.Get(ctx, in.Name) })
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "update-schedule", Method: http.MethodPatch, Path: "/v1/schedules/{name}", Tags: tags,
		Summary:     "Change a schedule's fields (those given)",
		Description: "A change of when it fires (cron, tz, every, jitter) points it at its first tick from now; other changes keep its next fire.",
		Errors:      []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *patchScheduleInput) (*scheduleOutput, error) {
		// Every field reads before the update: a 400 stores nothing.
		if err := in.Body.apply(&schedule.Schedule{}); err != nil {
			return nil, err
		}
		return s.scheduleDo(ctx, in.Name, func(c *schedule.Client) (schedule.Schedule, error) {
			return c.Update(ctx, in.Name, func(sc *schedule.Schedule) { _ = in.Body.apply(sc) })
		})
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "delete-schedule", Method: http.MethodDelete, Path: "/v1/schedules/{name}", Tags: tags,
		Summary: "Delete a schedule and its history (its tasks stay)", DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *schedulePath) (*struct{}, error) {
		_, err := s.scheduleDo(ctx, in.Name, func(c *schedule.Client) (schedule.Schedule, error) {
			return schedule.Schedule{}, c.Delete(ctx, in.Name)
		})
		return nil, err
	})
	for _, v := range []struct{ verb, summary string }{
		{"pause", "Stop a schedule's fires until resume (a trigger still fires)"},
		{"resume", "Fire a paused schedule again from its next tick (the ticks missed meanwhile do not fire)"},
	} {
		huma.Register(s.api, huma.Operation{
			OperationID: v.verb + "-schedule", Method: http.MethodPost, Path: "/v1/schedules/{name}/" + v.verb, Tags: tags,
			Summary: v.summary, Errors: []int{http.StatusNotFound},
		}, func(ctx context.Context, in *schedulePath) (*scheduleOutput, error) {
			return s.scheduleDo(ctx, in.Name, func(c *schedule.Client) (schedule.Schedule, error) {
				if v.verb == "pause" {
					return c.Pause(ctx, in.Name)
				}
				return c.Resume(ctx, in.Name)
			})
		})
	}
}

// scheduleDo checks name and runs do with the request's schedule client.
func (s *Server) scheduleDo(ctx context.Context, name string, do func(c *schedule.Client) (schedule.Schedule, error)) (*scheduleOutput, error) {
	if err := checkKeyName("path.name", name); err != nil {
		return nil, err
	}
	c, err := s.schedules(ctx)
	if err != nil {
		return nil, err
	}
	out, err := do(c)
	if err != nil {
		return nil, scheduleProblem(err)
	}
	return &scheduleOutput{scheduleBodyOf(out)}, nil
}

type fireOutput struct{ Body FireBody }

func (s *Server) scheduleFireRoutes(tags []string) {
	huma.Register(s.api, huma.Operation{
		OperationID: "trigger-schedule", Method: http.MethodPost, Path: "/v1/schedules/{name}/trigger", Tags: tags,
		Summary: "Fire a schedule once now, with a task id of its own (paused or not)", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *schedulePath) (*fireOutput, error) {
		if err := checkKeyName("path.name", in.Name); err != nil {
			return nil, err
		}
		c, err := s.schedules(ctx)
		if err != nil {
			return nil, err
		}
		f, err := c.Trigger(ctx, in.Name)
		if err != nil {
			return nil, scheduleProblem(err)
		}
		return &fireOutput{fireBodyOf(f)}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "schedule-history", Method: http.MethodGet, Path: "/v1/schedules/{name}/history", Tags: tags,
		Summary: "A schedule's fires, newest first: nominal time, submit time, task id, outcome", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *historyInput) (*struct {
		Body struct {
			Data []FireBody `json:"data"`
		}
	}, error) {
		if err := checkKeyName("path.name", in.Name); err != nil {
			return nil, err
		}
		c, err := s.schedules(ctx)
		if err != nil {
			return nil, err
		}
		fires, err := c.History(ctx, in.Name, in.Limit)
		if err != nil {
			return nil, scheduleProblem(err)
		}
		out := &struct {
			Body struct {
				Data []FireBody `json:"data"`
			}
		}{}
		out.Body.Data = make([]FireBody, len(fires))
		for i, f := range fires {
			out.Body.Data[i] = fireBodyOf(f)
		}
		return out, nil
	})
}
