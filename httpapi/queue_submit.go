package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/queue"
)

// NDJSON submissions: tasks are submitted in chunks of this many lines as
// they arrive; more rejected lines than maxRejectedLines stop the
// submission (the body is plainly not NDJSON).
const (
	submitChunk      = 5000
	maxRejectedLines = 1000
	maxLine          = 2 * queue.MaxPayload
)

// submitInput is a submission: the body is read by the handler, as it
// arrives, not by huma (see Resolve).
type submitInput struct {
	Queue       string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	body        io.Reader
	contentType string
	length      int64
}

// Resolve takes the request's body reader for the handler.
func (in *submitInput) Resolve(ctx huma.Context) []error {
	in.body = ctx.BodyReader()
	in.contentType = ctx.Header("Content-Type")
	in.length = -1
	if v := ctx.Header("Content-Length"); v != "" {
		in.length, _ = strconv.ParseInt(v, 10, 64)
	}
	return nil
}

type submitOutput struct{ Body SubmitResult }

// errTooLarge is the error of a read past MaxSubmitBytes.
var errTooLarge = errors.New("submission too large")

// limitReader reads at most left bytes and fails with errTooLarge past
// them.
type limitReader struct {
	r    io.Reader
	left int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		var one [1]byte
		if n, _ := l.r.Read(one[:]); n > 0 {
			return 0, errTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

func tooLarge(detail string) error {
	return huma.NewError(http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is too large limit=%d bytes%s", MaxSubmitBytes, detail))
}

func (s *Server) submitRoute() {
	const path = "/v1/queues/{queue}/tasks"
	huma.Register(s.api, huma.Operation{
		OperationID: "submit-tasks", Method: http.MethodPost, Path: path, Tags: []string{"queues"},
		Summary: "Submit tasks: a JSON array, or NDJSON streamed",
		Description: "Content-Type application/json: an array of tasks, checked whole first: any invalid one gets 400 with every " +
			"rejected position in lines, and nothing is stored. Content-Type application/x-ndjson: one task a line, submitted in " +
			"chunks as the body arrives; lines that are not valid tasks are listed in rejected with their line number while the " +
			"valid ones go in (more than 1,000 rejected lines stop the submission: 400). Idempotent on task_id: the same task again " +
			"counts as a duplicate. A queue at its maximum depth answers 429 (Retry-After), a store past its high-water mark 507; " +
			"the detail says how many went in before.",
		MaxBodyBytes: MaxSubmitBytes,
		Errors:       []int{http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusTooManyRequests, http.StatusInsufficientStorage},
	}, s.submitTasks)
	// The handler reads the body itself (huma would read it whole before
	// the handler starts): describe it in the OpenAPI document.
	if item := s.api.OpenAPI().Paths[path]; item != nil && item.Post != nil {
		arr := s.api.OpenAPI().Components.Schemas.Schema(reflectTaskInput, true, "SubmittedTask")
		item.Post.RequestBody = &huma.RequestBody{Required: true, Description: "The tasks.", Content: map[string]*huma.MediaType{
			"application/json":     {Schema: &huma.Schema{Type: "array", Items: arr}},
			"application/x-ndjson": {Schema: &huma.Schema{Type: "string", Description: "One task (a JSON object as in the array) a line."}},
		}}
	}
}

func (s *Server) submitTasks(ctx context.Context, in *submitInput) (*submitOutput, error) {
	if err := checkQueue(in.Queue); err != nil {
		return nil, err
	}
	if in.length > MaxSubmitBytes {
		return nil, tooLarge(": split the batch")
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	body := &limitReader{r: in.body, left: MaxSubmitBytes}
	mt := "application/json"
	if in.contentType != "" {
		if mt, _, err = mime.ParseMediaType(in.contentType); err != nil {
			mt = in.contentType
		}
	}
	switch mt {
	case "application/json":
		tasks, err := readTaskArray(body)
		if err != nil {
			return nil, err
		}
		res, err := c.Submit(ctx, in.Queue, tasks, nil)
		if err != nil {
			return nil, problem(err, queueWhere)
		}
		return &submitOutput{SubmitResult(res)}, nil
	case "application/x-ndjson", "application/jsonl", "application/x-jsonlines":
		res, err := submitLines(ctx, c, in.Queue, body)
		if err != nil {
			return nil, err
		}
		return &submitOutput{res}, nil
	}
	return nil, newProblem(http.StatusUnsupportedMediaType, "unsupported-media-type",
		fmt.Sprintf("Content-Type %q: send application/json (an array of tasks) or application/x-ndjson (one task a line)", in.contentType))
}

// readTaskArray reads a JSON array of tasks, every one valid, or answers
// 400 naming each rejected position (413 past MaxSubmitBytes).
func readTaskArray(r io.Reader) ([]queue.Task, error) {
	dec := json.NewDecoder(r)
	bad := func(err error) error {
		if errors.Is(err, errTooLarge) {
			return tooLarge(": split the batch")
		}
		return invalid("body", nil, "must be a JSON array of tasks: "+err.Error())
	}
	if tok, err := dec.Token(); err != nil {
		return nil, bad(err)
	} else if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, bad(fmt.Errorf("it starts with %v", tok))
	}
	tasks := []queue.Task{}
	var rejected []queue.LineError
	for i := 1; dec.More(); i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, bad(err)
		}
		t, err := queue.ParseLine(raw)
		if err == nil {
			err = t.Validate()
		}
		if err != nil {
			rejected = append(rejected, queue.LineError{Line: i, Error: err.Error()})
			continue
		}
		tasks = append(tasks, t)
	}
	if _, err := dec.Token(); err != nil {
		return nil, bad(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bad(errors.New("more than one JSON value"))
	}
	if len(rejected) > 0 {
		return nil, rejectedProblem(rejected, fmt.Sprintf("%d of the tasks are not valid (see lines: each one's 1-based position and why); nothing was stored: fix them and submit again", len(rejected)))
	}
	return tasks, nil
}

// rejectedProblem is the 400 of a submission with rejected tasks.
func rejectedProblem(rejected []queue.LineError, detail string) *Problem {
	p := newProblem(http.StatusBadRequest, "invalid-input", detail)
	p.Lines = rejected
	for _, r := range rejected[:min(len(rejected), 20)] {
		p.Errors = append(p.Errors, &huma.ErrorDetail{Location: fmt.Sprintf("body[%d]", r.Line-1), Message: r.Error})
	}
	return p
}

// submitLines streams an NDJSON body into queue q in chunks: rejected
// lines are listed with their numbers while the valid ones go in.
func submitLines(ctx context.Context, c *queue.Client, q string, body io.Reader) (SubmitResult, error) {
	total := SubmitResult{Rejected: []queue.LineError{}}
	br := bufio.NewReaderSize(body, 256<<10)
	var batch []queue.Task
	var lines []int
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		res, err := c.Submit(ctx, q, batch, nil)
		total.Submitted += res.Submitted
		total.Duplicates += res.Duplicates
		for _, rj := range res.Rejected {
			total.Rejected = append(total.Rejected, queue.LineError{Line: lines[rj.Line-1], Error: rj.Error})
		}
		batch, lines = batch[:0], lines[:0]
		var qf *queue.QueueFullError
		if errors.As(err, &qf) {
			full := *qf
			full.Submitted = total.Submitted
			err = &full
		}
		if err != nil {
			return problem(err, queueWhere)
		}
		return nil
	}
	for lineNo := 1; ; lineNo++ {
		text, tooLong, err := readLine(br)
		if errors.Is(err, errTooLarge) {
			return total, tooLarge(fmt.Sprintf(": stopped at line %d after submitting %d (duplicates %d); send the rest in another request: lines already in count as duplicates", lineNo, total.Submitted, total.Duplicates))
		}
		if err != nil && err != io.EOF {
			return total, problem(fmt.Errorf("read line %d of the body: %w", lineNo, err), nil)
		}
		if lineNo == 1 {
			text = bytes.TrimPrefix(text, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
		}
		switch {
		case tooLong:
			total.Rejected = append(total.Rejected, queue.LineError{Line: lineNo, Error: fmt.Sprintf("line longer than %d bytes: put large inputs behind input_data_uri", maxLine)})
		case len(bytes.TrimSpace(text)) == 0: // blank lines are skipped
		default:
			if t, perr := queue.ParseLine(text); perr != nil {
				total.Rejected = append(total.Rejected, queue.LineError{Line: lineNo, Error: perr.Error()})
			} else {
				batch, lines = append(batch, t), append(lines, lineNo)
			}
		}
		if len(total.Rejected) > maxRejectedLines {
			queue.SortLineErrors(total.Rejected)
			return total, rejectedProblem(total.Rejected, fmt.Sprintf("the body is not NDJSON: more than %d lines rejected; stopped at line %d after submitting %d (duplicates %d): fix the input and submit it again, lines already in count as duplicates",
				maxRejectedLines, lineNo, total.Submitted, total.Duplicates))
		}
		if len(batch) == submitChunk || err == io.EOF {
			if ferr := flush(); ferr != nil {
				return total, ferr
			}
		}
		if err == io.EOF {
			queue.SortLineErrors(total.Rejected)
			return total, nil
		}
	}
}

// readLine reads one line without its end; a line longer than maxLine is
// consumed and reported too long, without its text.
func readLine(r *bufio.Reader) (text []byte, tooLong bool, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		if !tooLong {
			if len(text)+len(chunk) > maxLine+2 {
				tooLong, text = true, nil
			} else {
				text = append(text, chunk...)
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return bytes.TrimRight(text, "\r\n"), tooLong, err
	}
}
