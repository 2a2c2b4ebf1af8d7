package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
)

type listTasksInput struct {
	Queue  string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	Status string `query:"status" enum:"SCHEDULED,PENDING,RUNNING,RETRYING,SLEEPING,WAITING,SUCCEEDED,DEAD,CANCELLED" default:"PENDING" doc:"The status of the tasks listed."`
	Limit  int    `query:"limit" minimum:"1" maximum:"1000" default:"100" doc:"The most tasks on the page."`
	After  string `query:"after" maxLength:"512" doc:"The next of the page before: the page starts after it."`
}

type dlqListInput struct {
	Queue string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	Limit int    `query:"limit" minimum:"1" maximum:"1000" default:"100" doc:"The most tasks on the page."`
	After string `query:"after" maxLength:"512" doc:"The next of the page before: the page starts after it."`
}

type pageOutput struct{ Body TaskPage }

type runNowInput struct {
	Queue string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	// Body is optional (a pointer, so huma does not require it): no body,
	// or no ids, makes every scheduled task of the queue due.
	Body *struct {
		IDs []string `json:"ids,omitempty" maxItems:"10000" doc:"The scheduled tasks to make due now; empty or absent: every scheduled task of the queue."`
	}
}

// RunNowResult answers a run-now: how many scheduled tasks became due.
type RunNowResult struct {
	Queue string `json:"queue" doc:"The queue."`
	Moved int    `json:"moved" doc:"How many scheduled tasks became PENDING."`
}

type runNowOutput struct{ Body RunNowResult }

// taskQueryRoutes registers the routes that read and cancel a queue's
// tasks (drover tasks ...).
func (s *Server) taskQueryRoutes(tags []string) {
	huma.Register(s.api, huma.Operation{
		OperationID: "get-queue-task", Method: http.MethodGet, Path: "/v1/queues/{queue}/tasks/{id}", Tags: tags,
		Summary: "Read a task: its status, result and history, what it waits for and the signals it received",
		Errors:  []int{http.StatusNotFound},
	}, func(ctx context.Context, in *queueTaskPath) (*queueTaskOutput, error) {
		t, err := s.queueTask(ctx, in)
		if err != nil {
			return nil, err
		}
		out := queueTaskOf(t)
		c, err := s.queueClient(ctx)
		if err != nil {
			return nil, err
		}
		sigs, err := c.Signals(ctx, t.ID)
		if err != nil {
			return nil, problem(err, queueWhere)
		}
		if len(sigs) > 0 {
			out.Signals = taskSignalsOf(sigs)
		}
		if err := s.addFamily(ctx, t, &out); err != nil {
			return nil, err
		}
		return &queueTaskOutput{out}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "list-queue-tasks", Method: http.MethodGet, Path: "/v1/queues/{queue}/tasks", Tags: tags,
		Summary:     "List a queue's tasks in one status, a page at a time",
		Description: "Pass a page's next as after for the next page; walking every page sees each task that stays in the status once.",
	}, func(ctx context.Context, in *listTasksInput) (*pageOutput, error) {
		return s.listTasks(ctx, queuePath{in.Queue}, queue.Status(in.Status), in.Limit, in.After)
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "queue-stats", Method: http.MethodGet, Path: "/v1/queues/{queue}/stats", Tags: tags,
		Summary: "Count a queue's tasks by status",
	}, func(ctx context.Context, in *queuePath) (*struct{ Body QueueStats }, error) {
		c, err := s.queueFor(ctx, in.Queue)
		if err != nil {
			return nil, err
		}
		st, err := c.Stats(ctx, in.Queue)
		if err != nil {
			return nil, problem(err, queueWhere)
		}
		return &struct{ Body QueueStats }{QueueStats{Queue: in.Queue, Pending: st.Pending, Running: st.Running, Retrying: st.Retrying,
			Succeeded: st.Succeeded, Dead: st.Dead, Cancelled: st.Cancelled, Scheduled: st.Scheduled, Paused: st.Paused, Sleeping: st.Sleeping, Waiting: st.Waiting}}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "cancel-queue-task", Method: http.MethodPost, Path: "/v1/queues/{queue}/tasks/{id}/cancel", Tags: tags,
		Summary: "Cancel a task, whatever its state",
		Description: "The task leaves every index and is CANCELLED; a running task's claim is taken away, so its worker's heartbeat, " +
			"ack and fail get 409. 409 when the task already finished.",
		Errors: []int{http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *queueTaskPath) (*queueTaskOutput, error) {
		c, err := s.queueFor(ctx, in.Queue)
		if err != nil {
			return nil, err
		}
		if _, err := s.queueTask(ctx, in); err != nil {
			return nil, err
		}
		t, err := c.Cancel(ctx, in.ID)
		if err != nil {
			return nil, problem(err, queueWhere)
		}
		return &queueTaskOutput{queueTaskOf(t)}, nil
	})
	s.runNowRoutes(tags)
}

// runNowRoutes registers the routes that make scheduled tasks due now
// (drover tasks requeue --status SCHEDULED).
func (s *Server) runNowRoutes(tags []string) {
	huma.Register(s.api, huma.Operation{
		OperationID: "run-scheduled-tasks-now", Method: http.MethodPost, Path: "/v1/queues/{queue}/tasks/run-now", Tags: tags,
		Summary: "Make scheduled tasks due now: those named by ids, or every one of the queue",
		Description: "Each task named (or, with no ids, every SCHEDULED task of the queue) becomes PENDING at once; the other " +
			"tasks of its submission keep their time. 409 when a task named is not SCHEDULED in the queue, " +
			"404 for an unknown queue or task.",
		Errors: []int{http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *runNowInput) (*runNowOutput, error) {
		var ids []string
		if in.Body != nil {
			ids = in.Body.IDs
		}
		for i, id := range ids {
			if err := keyspace.CheckName("task id", id); err != nil {
				return nil, problem(&drover.InputError{Field: fmt.Sprintf("body.ids[%d]", i), Value: id, Rule: "must be a task id: " + err.Error()}, nil)
			}
		}
		return s.runNow(ctx, in.Queue, ids, false)
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "run-scheduled-task-now", Method: http.MethodPost, Path: "/v1/queues/{queue}/tasks/{id}/run-now", Tags: tags,
		Summary:     "Make a scheduled task due now",
		Description: "The task becomes PENDING at once. 404 when it is not SCHEDULED in the queue.",
		Errors:      []int{http.StatusNotFound},
	}, func(ctx context.Context, in *queueTaskPath) (*runNowOutput, error) {
		t, err := s.queueTask(ctx, in)
		if err != nil {
			return nil, err
		}
		if t.CurrentStatus != queue.Scheduled {
			return nil, newProblem(http.StatusNotFound, "not-found", fmt.Sprintf("task %s is %s, not SCHEDULED in queue %s: "+
				"only a task waiting for its time can run now; read it with GET /v1/queues/%s/tasks/%s", t.ID, t.CurrentStatus, in.Queue, in.Queue, t.ID))
		}
		return s.runNow(ctx, in.Queue, []string{in.ID}, true)
	})
}

// runNow makes scheduled tasks ids of queue q due now, every one when ids
// is empty: 404 for an unknown queue, and for the task of a one-task
// route (one) that is no longer scheduled.
func (s *Server) runNow(ctx context.Context, q string, ids []string, one bool) (*runNowOutput, error) {
	c, err := s.queueFor(ctx, q)
	if err != nil {
		return nil, err
	}
	if ok, err := c.Exists(ctx, q); err != nil {
		return nil, problem(err, queueWhere)
	} else if !ok {
		return nil, problem(fmt.Errorf("%w %s: nothing was ever submitted to it; check the name (GET /v1/queues)", queue.ErrNoQueue, q), nil)
	}
	n, err := c.RunNow(ctx, q, ids, nil)
	if errors.Is(err, queue.ErrWrongStatus) && one {
		return nil, newProblem(http.StatusNotFound, "not-found", fmt.Sprintf("task %s is no longer SCHEDULED in queue %s (it fell due, "+
			"or was cancelled); read it with GET /v1/queues/%s/tasks/%s", ids[0], q, q, ids[0]))
	}
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	return &runNowOutput{RunNowResult{Queue: q, Moved: n}}, nil
}

// dlqRoutes registers the dead-letter queue's routes (drover dlq ...).
func (s *Server) dlqRoutes() {
	tags := []string{"dead-letter queue"}
	admin := map[string]any{"role": RoleAdmin}
	huma.Register(s.api, huma.Operation{
		OperationID: "list-dead-tasks", Method: http.MethodGet, Path: "/v1/queues/{queue}/dlq", Tags: tags,
		Summary: "List a queue's dead tasks, a page at a time",
	}, func(ctx context.Context, in *dlqListInput) (*pageOutput, error) {
		return s.listTasks(ctx, queuePath{in.Queue}, queue.Dead, in.Limit, in.After)
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "get-dead-task", Method: http.MethodGet, Path: "/v1/queues/{queue}/dlq/{id}", Tags: tags,
		Summary: "Read a dead task with its full error history; 404 when it is not dead",
		Errors:  []int{http.StatusNotFound},
	}, func(ctx context.Context, in *queueTaskPath) (*queueTaskOutput, error) {
		t, err := s.deadTask(ctx, in)
		if err != nil {
			return nil, err
		}
		return &queueTaskOutput{queueTaskOf(t)}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "requeue-dead-task", Method: http.MethodPost, Path: "/v1/queues/{queue}/dlq/{id}/requeue", Tags: tags,
		Summary: "Put a dead task back in the queue with a fresh retry budget",
		Errors:  []int{http.StatusNotFound},
	}, func(ctx context.Context, in *queueTaskPath) (*struct{ Body BulkResult }, error) {
		return s.deadChange(ctx, queuePath{in.Queue}, in.ID, "requeued")
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "requeue-dead-tasks", Method: http.MethodPost, Path: "/v1/queues/{queue}/dlq/requeue", Tags: tags,
		Summary: "Put every dead task of the queue back with a fresh retry budget (admin)", Metadata: admin,
	}, func(ctx context.Context, in *queuePath) (*struct{ Body BulkResult }, error) {
		return s.deadChange(ctx, *in, "", "requeued")
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "purge-dead-task", Method: http.MethodDelete, Path: "/v1/queues/{queue}/dlq/{id}", Tags: tags,
		Summary: "Delete a dead task for good (admin)", Metadata: admin,
		Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *queueTaskPath) (*struct{ Body BulkResult }, error) {
		return s.deadChange(ctx, queuePath{in.Queue}, in.ID, "purged")
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "purge-dead-tasks", Method: http.MethodDelete, Path: "/v1/queues/{queue}/dlq", Tags: tags,
		Summary: "Delete every dead task of the queue for good (admin)", Metadata: admin,
	}, func(ctx context.Context, in *queuePath) (*struct{ Body BulkResult }, error) {
		return s.deadChange(ctx, *in, "", "purged")
	})
}

// queueFor validates queue name q and returns a client of the request's
// namespace.
func (s *Server) queueFor(ctx context.Context, q string) (*queue.Client, error) {
	if err := checkQueue(q); err != nil {
		return nil, err
	}
	return s.queueClient(ctx)
}

// queueTask reads task in.ID of queue in.Queue: 404 when it is in another
// queue, or none.
func (s *Server) queueTask(ctx context.Context, in *queueTaskPath) (*queue.Task, error) {
	c, err := s.queueFor(ctx, in.Queue)
	if err != nil {
		return nil, err
	}
	t, err := c.Get(ctx, in.ID)
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	if t.Queue != in.Queue {
		return nil, problem(fmt.Errorf("%w: %s is not in queue %s", queue.ErrNotFound, in.ID, in.Queue), nil)
	}
	return t, nil
}

// deadTask reads dead task in.ID: 404 when it is not dead.
func (s *Server) deadTask(ctx context.Context, in *queueTaskPath) (*queue.Task, error) {
	t, err := s.queueTask(ctx, in)
	if err != nil {
		return nil, err
	}
	if t.CurrentStatus != queue.Dead {
		return nil, newProblem(http.StatusNotFound, "not-found", fmt.Sprintf("task %s is %s, not in the dead-letter queue of %s", t.ID, t.CurrentStatus, in.Queue))
	}
	return t, nil
}

// listTasks answers a page of queue in.Queue's tasks in status st.
func (s *Server) listTasks(ctx context.Context, in queuePath, st queue.Status, limit int, after string) (*pageOutput, error) {
	c, err := s.queueFor(ctx, in.Queue)
	if err != nil {
		return nil, err
	}
	page, err := c.List(ctx, in.Queue, queue.Status(strings.ToUpper(string(st))), queue.ListOptions{Limit: limit, After: after})
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	return &pageOutput{TaskPage{Tasks: queueTasksOf(page.Tasks), Next: page.Next}}, nil
}

// deadChange requeues or purges dead task id of queue in.Queue, or every
// one when id is "".
func (s *Server) deadChange(ctx context.Context, in queuePath, id, action string) (*struct{ Body BulkResult }, error) {
	c, err := s.queueFor(ctx, in.Queue)
	if err != nil {
		return nil, err
	}
	var ids []string
	if id != "" {
		if _, err := s.deadTask(ctx, &queueTaskPath{Queue: in.Queue, ID: id}); err != nil {
			return nil, err
		}
		ids = []string{id}
	}
	var n int
	if action == "requeued" {
		n, err = c.Requeue(ctx, in.Queue, ids, nil)
	} else {
		n, err = c.Purge(ctx, in.Queue, queue.Dead, ids, nil)
	}
	if errors.Is(err, queue.ErrNotDead) && id != "" {
		return nil, newProblem(http.StatusNotFound, "not-found", err.Error())
	}
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	return &struct{ Body BulkResult }{BulkResult{Queue: in.Queue, Status: string(queue.Dead), Action: action, Count: n}}, nil
}
