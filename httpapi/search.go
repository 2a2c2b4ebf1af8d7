package httpapi

import (
	"context"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/queue"
)

type searchInput struct {
	Queue    string   `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	Status   string   `query:"status" maxLength:"16" doc:"Only tasks in this status (indexed): SCHEDULED, PENDING, RUNNING, RETRYING, SUCCEEDED, DEAD or CANCELLED, in any case (pending), as the CLI takes it."`
	Type     string   `query:"type" maxLength:"128" doc:"Only tasks of this task_type (checked on the tasks read)."`
	IDPrefix string   `query:"id_prefix" maxLength:"128" doc:"Only tasks whose id starts with this (a range read of the id index)."`
	Param    []string `query:"param,explode" maxItems:"16" doc:"Only tasks whose parameters hold key=value (the value as JSON when it parses, else as a string); repeat for more (all must hold). Checked on the tasks read."`
	Since    string   `query:"since" maxLength:"64" doc:"Only tasks created at or after this: RFC 3339, or a duration back from now (1h, 90m)."`
	Until    string   `query:"until" maxLength:"64" doc:"Only tasks created before this: RFC 3339, or a duration back from now."`
	Limit    int      `query:"limit" minimum:"1" maximum:"1000" default:"100" doc:"The most tasks on the page."`
	Cursor   string   `query:"cursor" maxLength:"1024" doc:"The next_cursor of the page before, from the same query; a cursor of another query is refused."`
}

// SearchPage is one page of a search.
type SearchPage struct {
	Data       []QueueTask `json:"data" doc:"The tasks of the page; may be short, or empty, while next_cursor is set: the page read its budget of tasks first."`
	NextCursor string      `json:"next_cursor,omitempty" doc:"Pass as cursor, with the same query, for the next page; absent once every task was walked."`
	Scanned    int         `json:"scanned" doc:"How many tasks (and index keys) the page read."`
}

// searchWhere maps the search's input fields to the API's locations.
var searchWhere = map[string]string{"queue": "path.queue", "status": "query.status", "type": "query.type", "id_prefix": "query.id_prefix",
	"param": "query.param", "since": "query.since", "until": "query.until", "limit": "query.limit", "cursor": "query.cursor"}

// searchRoutes registers the search of a queue's tasks (drover tasks
// search).
func (s *Server) searchRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "search-queue-tasks", Method: http.MethodGet, Path: "/v1/queues/{queue}/search", Tags: []string{"queues"},
		Summary: "Find a queue's tasks by status, type, id prefix, parameters and creation time, a page at a time",
		Description: "Every filter given must hold. Pass a page's next_cursor as cursor, with the same filters, for the next page. " +
			"A page reads at most a budget of tasks, so it may come back short or empty with a next_cursor: keep going until it is absent. " +
			"404 when the queue does not exist.",
		Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *searchInput) (*struct{ Body SearchPage }, error) {
		c, err := s.queueFor(ctx, in.Queue)
		if err != nil {
			return nil, err
		}
		sq := queue.SearchQuery{Status: queue.Status(in.Status), Type: in.Type, IDPrefix: in.IDPrefix, Since: in.Since, Until: in.Until,
			Limit: in.Limit, Cursor: in.Cursor}
		for _, p := range in.Param {
			k, v, ok := strings.Cut(p, "=")
			if !ok {
				return nil, problem(&drover.InputError{Field: "param", Value: p, Rule: "must be key=value"}, searchWhere)
			}
			sq.Params = append(sq.Params, queue.ParamFilter{Key: k, Value: v})
		}
		page, err := c.Search(ctx, in.Queue, sq)
		if err != nil {
			return nil, problem(err, searchWhere)
		}
		return &struct{ Body SearchPage }{SearchPage{Data: queueTasksOf(page.Tasks), NextCursor: page.Next, Scanned: page.Scanned}}, nil
	})
}
