package agentserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
)

const tagCrons = "Agent Server: crons"

// cronBody is a cron's request, as the SDK sends it: when it fires, and
// the run each fire creates.
type cronBody struct {
	Schedule          string         `json:"schedule" minLength:"1" doc:"A cron expression of five fields (minute hour day-of-month month day-of-week) or a descriptor such as @hourly."`
	Timezone          string         `json:"timezone,omitempty" doc:"The IANA time zone the schedule is read in (UTC by default)."`
	EndTime           *time.Time     `json:"end_time,omitempty" doc:"No fire after this time."`
	Enabled           *bool          `json:"enabled,omitempty" doc:"Whether it fires (true by default)."`
	OnRunCompleted    string         `json:"on_run_completed,omitempty" enum:"delete,keep" doc:"A cron without a thread: keep (the default) each run's thread; delete is not served yet (501)."`
	AssistantID       string         `json:"assistant_id" minLength:"1" doc:"The assistant to run: its id, or a graph's name."`
	Input             any            `json:"input,omitempty" doc:"The graph's input of each run."`
	Config            map[string]any `json:"config,omitempty" doc:"Each run's config, over the assistant's."`
	Context           any            `json:"context,omitempty" doc:"Each run's context, over the assistant's."`
	Metadata          map[string]any `json:"metadata,omitempty" doc:"The cron's metadata, and each run's."`
	InterruptBefore   any            `json:"interrupt_before,omitempty" doc:"\"*\" or the nodes to interrupt before."`
	InterruptAfter    any            `json:"interrupt_after,omitempty" doc:"\"*\" or the nodes to interrupt after."`
	Webhook           string         `json:"webhook,omitempty" doc:"Not served yet (501)."`
	MultitaskStrategy string         `json:"multitask_strategy,omitempty" enum:"reject,enqueue,interrupt,rollback" doc:"What a fire does while the thread has an active run: reject (the default: the tick makes no run); the others are not served yet (501)."`
	CheckpointID      string         `json:"checkpoint_id,omitempty" doc:"The checkpoint each run starts from."`
	CheckpointDuring  *bool          `json:"checkpoint_during,omitempty"`
	Durability        string         `json:"durability,omitempty" enum:"sync,async,exit"`
	StreamMode        any            `json:"stream_mode,omitempty" doc:"The stream modes of each run."`
	StreamSubgraphs   bool           `json:"stream_subgraphs,omitempty"`
	StreamResumable   bool           `json:"stream_resumable,omitempty"`
}

// payload is the run part of b, as the cron stores it.
func (b cronBody) payload() map[string]any {
	p := map[string]any{}
	set := func(k string, v any, given bool) {
		if given {
			p[k] = v
		}
	}
	set("input", b.Input, b.Input != nil)
	set("config", b.Config, b.Config != nil)
	set("context", b.Context, b.Context != nil)
	set("metadata", b.Metadata, b.Metadata != nil)
	set("interrupt_before", b.InterruptBefore, b.InterruptBefore != nil)
	set("interrupt_after", b.InterruptAfter, b.InterruptAfter != nil)
	set("multitask_strategy", b.MultitaskStrategy, b.MultitaskStrategy != "")
	set("checkpoint_id", b.CheckpointID, b.CheckpointID != "")
	set("checkpoint_during", b.CheckpointDuring, b.CheckpointDuring != nil)
	set("durability", b.Durability, b.Durability != "")
	set("stream_mode", b.StreamMode, b.StreamMode != nil)
	set("stream_subgraphs", b.StreamSubgraphs, b.StreamSubgraphs)
	set("stream_resumable", b.StreamResumable, b.StreamResumable)
	return p
}

// checkRunOptions refuses what a fire's run could not serve.
func checkRunOptions(webhook, strategy string) error {
	switch {
	case webhook != "":
		return notBuilt("body.webhook", "webhooks")
	case strategy != "" && strategy != "reject":
		return notBuilt("body.multitask_strategy", "multitask strategy "+strategy+" for a cron's runs")
	}
	return nil
}

// newCron checks b and makes the cron it asks for, on thread ("" for
// none): the assistant and the thread must exist.
func (s *server) newCron(ctx context.Context, thread string, b cronBody) (Cron, error) {
	if err := checkRunOptions(b.Webhook, b.MultitaskStrategy); err != nil {
		return Cron{}, err
	}
	a, _, err := s.getAssistant(ctx, b.AssistantID)
	if isNotFound(err) {
		return Cron{}, huma.NewError(http.StatusNotFound, fmt.Sprintf("No assistant found for %q. Make sure the assistant ID is for a valid assistant or a valid graph ID.", b.AssistantID),
			&huma.ErrorDetail{Location: "body.assistant_id", Value: b.AssistantID, Message: "no such assistant"})
	}
	if err != nil {
		return Cron{}, err
	}
	now := s.now()
	c := Cron{CronID: s.ids.next(now), AssistantID: a.AssistantID, Schedule: strings.TrimSpace(b.Schedule), CreatedAt: now, UpdatedAt: now,
		Payload: b.payload(), Metadata: orEmpty(b.Metadata), Enabled: b.Enabled == nil || *b.Enabled}
	if thread != "" {
		if _, _, err := s.getThread(ctx, thread); err != nil {
			return Cron{}, err
		}
		c.ThreadID = &thread
	} else {
		if b.OnRunCompleted == "delete" { // nothing would delete the threads yet: a cron per minute would leave 1,440 a day
			return Cron{}, notBuilt("body.on_run_completed", "deleting a threadless cron's thread after its run")
		}
		c.OnRunCompleted = "keep"
	}
	if b.Timezone != "" {
		c.Timezone = &b.Timezone
	}
	if b.EndTime != nil {
		t := b.EndTime.UTC()
		c.EndTime = &t
	}
	return s.createCron(ctx, c)
}

type cronOutput struct {
	Body Cron
}

type cronPath struct {
	CronID string `path:"cron_id" doc:"The cron's id, a UUID."`
}

func cronID(id string) (string, error) {
	if !isUUID(id) {
		return "", badInput("path.cron_id", id, "must be a UUID")
	}
	return strings.ToLower(id), nil
}

// cronUpdateBody is a cron's update: the fields given change.
type cronUpdateBody struct {
	Schedule        *string        `json:"schedule,omitempty" doc:"A new cron expression."`
	Timezone        *string        `json:"timezone,omitempty"`
	EndTime         *time.Time     `json:"end_time,omitempty" doc:"A new end time (null clears it)." nullable:"true"`
	Enabled         *bool          `json:"enabled,omitempty"`
	OnRunCompleted  string         `json:"on_run_completed,omitempty" enum:"delete,keep"`
	Input           any            `json:"input,omitempty"`
	Config          map[string]any `json:"config,omitempty"`
	Context         any            `json:"context,omitempty"`
	Metadata        map[string]any `json:"metadata,omitempty" doc:"Replaces the cron's metadata."`
	InterruptBefore any            `json:"interrupt_before,omitempty"`
	InterruptAfter  any            `json:"interrupt_after,omitempty"`
	Webhook         string         `json:"webhook,omitempty" doc:"Not served yet (501)."`
	StreamMode      any            `json:"stream_mode,omitempty"`
	StreamSubgraphs bool           `json:"stream_subgraphs,omitempty"`
	StreamResumable bool           `json:"stream_resumable,omitempty"`
	Durability      string         `json:"durability,omitempty" enum:"sync,async,exit"`
	// clearEnd is set when the body gives end_time as null.
	clearEnd bool
}

// UnmarshalJSON reads b as the fields it names, and end_time given as
// null as clearing the cron's end time (a pointer alone cannot tell null
// from absent).
func (b *cronUpdateBody) UnmarshalJSON(raw []byte) error {
	type plain cronUpdateBody
	if err := json.Unmarshal(raw, (*plain)(b)); err != nil {
		return err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return err
	}
	end, given := fields["end_time"]
	b.clearEnd = given && string(bytes.TrimSpace(end)) == "null"
	return nil
}

type searchCronsInput struct {
	Body struct {
		AssistantID string         `json:"assistant_id,omitempty" doc:"Only crons of this assistant."`
		ThreadID    string         `json:"thread_id,omitempty" doc:"Only crons of this thread."`
		Enabled     *bool          `json:"enabled,omitempty" doc:"Only crons enabled (true) or disabled (false)."`
		Metadata    map[string]any `json:"metadata,omitempty" doc:"Only crons whose metadata contains this."`
		Limit       int            `json:"limit,omitempty" minimum:"1" maximum:"1000" default:"10"`
		Offset      int            `json:"offset,omitempty" minimum:"0" maximum:"2147483647"`
		SortBy      string         `json:"sort_by,omitempty" enum:"cron_id,assistant_id,thread_id,created_at,updated_at,next_run_date"`
		SortOrder   string         `json:"sort_order,omitempty" enum:"asc,desc"`
		Select      []string       `json:"select,omitempty" enum:"cron_id,assistant_id,thread_id,on_run_completed,end_time,schedule,timezone,created_at,updated_at,payload,user_id,next_run_date,metadata,enabled" doc:"Only these fields of each cron."`
	}
}

// filterIDs checks the ids of a cron filter and puts them in lower case.
func (f *cronFilter) checkIDs() error {
	if f.ThreadID != "" {
		if !isUUID(f.ThreadID) {
			return badInput("body.thread_id", f.ThreadID, "must be a UUID")
		}
		f.ThreadID = strings.ToLower(f.ThreadID)
	}
	if f.AssistantID != "" {
		f.AssistantID = assistantKeyID(f.AssistantID)
	}
	return nil
}

func (s *server) cronRoutes(api huma.API) {
	tags := []string{tagCrons}
	errs := []int{http.StatusBadRequest, http.StatusNotFound, http.StatusNotImplemented}
	huma.Register(api, huma.Operation{
		OperationID: "lg-create-thread-cron", Method: http.MethodPost, Path: "/threads/{thread_id}/runs/crons", Tags: tags,
		Summary:     "Create a cron on a thread (LangGraph)",
		Description: "A schedule whose every tick makes one run on the thread with the cron's input and config, once across servers and restarts.",
		Errors:      errs,
	}, func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		Body     cronBody
	}) (*cronOutput, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		c, err := s.newCron(ctx, id, in.Body)
		return &cronOutput{Body: c}, err
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-create-cron", Method: http.MethodPost, Path: "/runs/crons", Tags: tags,
		Summary:     "Create a cron of an assistant (LangGraph)",
		Description: "A schedule whose every tick makes one run on a new thread, kept after the run (on_run_completed delete is not served yet: 501).",
		Errors:      errs,
	}, func(ctx context.Context, in *struct{ Body cronBody }) (*cronOutput, error) {
		c, err := s.newCron(ctx, "", in.Body)
		return &cronOutput{Body: c}, err
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-update-cron", Method: http.MethodPatch, Path: "/runs/crons/{cron_id}", Tags: tags,
		Summary: "Update a cron (LangGraph)", Errors: errs,
	}, func(ctx context.Context, in *struct {
		CronID string `path:"cron_id" doc:"The cron's id, a UUID."`
		Body   cronUpdateBody
	}) (*cronOutput, error) {
		id, err := cronID(in.CronID)
		if err != nil {
			return nil, err
		}
		if err := checkRunOptions(in.Body.Webhook, ""); err != nil {
			return nil, err
		}
		c, err := s.updateCron(ctx, id, in.Body.patch())
		return &cronOutput{Body: c}, err
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-delete-cron", Method: http.MethodDelete, Path: "/runs/crons/{cron_id}", Tags: tags,
		Summary: "Delete a cron (LangGraph)", Description: "It fires no more: a fire in flight makes no run.",
		DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *cronPath) (*struct{}, error) {
		id, err := cronID(in.CronID)
		if err != nil {
			return nil, err
		}
		return nil, s.deleteCron(ctx, id)
	})
	s.cronListRoutes(api, tags)
}

func (b cronUpdateBody) patch() cronPatch {
	p := cronPatch{Schedule: b.Schedule, Timezone: b.Timezone, EndTime: b.EndTime, ClearEnd: b.clearEnd, Enabled: b.Enabled, Metadata: b.Metadata, Payload: map[string]any{}}
	set := func(k string, v any, given bool) {
		if given {
			p.Payload[k] = v
		}
	}
	set("input", b.Input, b.Input != nil)
	set("config", b.Config, b.Config != nil)
	set("context", b.Context, b.Context != nil)
	set("interrupt_before", b.InterruptBefore, b.InterruptBefore != nil)
	set("interrupt_after", b.InterruptAfter, b.InterruptAfter != nil)
	set("stream_mode", b.StreamMode, b.StreamMode != nil)
	set("stream_subgraphs", b.StreamSubgraphs, b.StreamSubgraphs)
	set("stream_resumable", b.StreamResumable, b.StreamResumable)
	set("durability", b.Durability, b.Durability != "")
	return p
}

func (s *server) cronListRoutes(api huma.API, tags []string) {
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-search-crons", Method: http.MethodPost, Path: "/runs/crons/search", Tags: tags,
		Summary: "Search crons (LangGraph)", Description: "Newest first unless sort_by and sort_order say otherwise.",
		Errors: []int{http.StatusBadRequest},
	}), func(ctx context.Context, in *searchCronsInput) (*struct{ Body []any }, error) {
		b := in.Body
		f := cronFilter{AssistantID: b.AssistantID, ThreadID: b.ThreadID, Enabled: b.Enabled, Metadata: b.Metadata}
		if err := f.checkIDs(); err != nil {
			return nil, err
		}
		list, err := s.listCrons(ctx, f, b.SortBy, b.SortOrder)
		if err != nil {
			return nil, err
		}
		lo, hi, _, _ := page(len(list), b.Offset, b.Limit)
		out := &struct{ Body []any }{Body: []any{}}
		for _, c := range list[lo:hi] {
			v, err := selectFields(c, b.Select)
			if err != nil {
				return nil, err
			}
			out.Body = append(out.Body, v)
		}
		return out, nil
	})
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-count-crons", Method: http.MethodPost, Path: "/runs/crons/count", Tags: tags,
		Summary: "Count crons (LangGraph)", Errors: []int{http.StatusBadRequest},
	}), func(ctx context.Context, in *struct{ Body cronFilter }) (*struct{ Body int }, error) {
		f := in.Body
		if err := f.checkIDs(); err != nil {
			return nil, err
		}
		list, err := s.listCrons(ctx, f, "", "")
		if err != nil {
			return nil, err
		}
		return &struct{ Body int }{Body: len(list)}, nil
	})
}
