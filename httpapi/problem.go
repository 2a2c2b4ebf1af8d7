package httpapi

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/registry"
	"github.com/droverhq/drover/task"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Problem is an RFC 9457 problem document: every error the API answers
// with, as application/problem+json. Errors lists the inputs at fault, each
// with its location ("body.ttl", "path.name", "query.wait", "body[3]") and
// the rule it broke.
type Problem struct {
	Type     string              `json:"type,omitempty" doc:"A URI naming the kind of problem; about:blank when the status says it all."`
	Title    string              `json:"title,omitempty" doc:"The status's short summary."`
	Status   int                 `json:"status,omitempty" doc:"The HTTP status code."`
	Detail   string              `json:"detail,omitempty" doc:"What went wrong in this request, and what to do about it."`
	Instance string              `json:"instance,omitempty" doc:"The request's path."`
	Errors   []*huma.ErrorDetail `json:"errors,omitempty" doc:"The inputs at fault: location, value and the rule each broke."`
	// Holder names who holds a lock, on a 409 of a lock route.
	Holder *LockStatus `json:"holder,omitempty" doc:"On a lock's 409: who holds it."`
	// Lines are a submission's rejected lines, on its 400.
	Lines []queue.LineError `json:"lines,omitempty" doc:"On a submission's 400: the rejected lines."`

	headers http.Header
}

// Error implements error.
func (p *Problem) Error() string { return p.Detail }

// GetStatus implements huma.StatusError.
func (p *Problem) GetStatus() int { return p.Status }

// GetHeaders implements huma.HeadersError (Retry-After on 429 and 503).
func (p *Problem) GetHeaders() http.Header { return p.headers }

// ContentType implements huma.ContentTypeFilter: problems are
// application/problem+json.
func (p *Problem) ContentType(ct string) string {
	if ct == "application/json" || ct == "" {
		return "application/problem+json"
	}
	return ct
}

// problemTypes name each kind of problem the API gives, under one base.
const problemBase = "https://drover.dev/problems/"

func init() {
	// Every error huma writes itself (malformed JSON, a body that does not
	// match the schema, an oversized body) becomes a Problem too. huma
	// says 422 for a body that parses but breaks the schema (unknown
	// field, wrong type); the API says 400 for every bad input.
	huma.NewError = func(status int, msg string, errs ...error) huma.StatusError {
		if status == http.StatusUnprocessableEntity {
			status = http.StatusBadRequest
		}
		p := &Problem{Status: status, Title: http.StatusText(status), Detail: msg}
		for _, e := range errs {
			if e == nil {
				continue
			}
			var d huma.ErrorDetailer
			if errors.As(e, &d) {
				p.Errors = append(p.Errors, d.ErrorDetail())
			} else {
				p.Errors = append(p.Errors, &huma.ErrorDetail{Message: e.Error()})
			}
		}
		scrub(p.Errors)
		switch status {
		case http.StatusBadRequest:
			p.Type = problemBase + "invalid-input"
			p.Detail = badInputDetail(msg, p.Errors)
		case http.StatusRequestEntityTooLarge:
			p.Type = problemBase + "too-large"
			p.Detail = msg + ": send less per request (submissions: split the batch)"
		case http.StatusUnsupportedMediaType:
			p.Type = problemBase + "unsupported-media-type"
			p.Detail = "this route takes JSON: send the header `Content-Type: application/json` (a body without Content-Type, " +
				"or sent as a form with curl -d, is read as JSON too)"
		default:
			p.Type = problemBase + kindOf(status)
		}
		return p
	}
}

// kindOf names the problem of a status huma answers with on its own.
func kindOf(status int) string {
	switch status {
	case http.StatusNotAcceptable:
		return "not-acceptable"
	case http.StatusInternalServerError:
		return "internal"
	}
	return strings.ReplaceAll(strings.ToLower(http.StatusText(status)), " ", "-")
}

// secretInputs are the inputs whose values an error never repeats: a
// session id holds its secret, and a mistyped one may be a real one.
var secretInputs = []string{"session", "token", "secret", "password", "authorization"}

// scrub removes from errs the values that may hold a secret: the whole
// body (what huma repeats of a body it cannot parse) and every input whose
// name says it holds one; a value that looks like a session id, wherever
// it is, and the value of an input that must be one (path.id of the
// session routes, which breaks sessionIDPattern) keep only a lease part. The
// location and the rule stay.
func scrub(errs []*huma.ErrorDetail) {
	for _, e := range errs {
		if e == nil {
			continue
		}
		loc := strings.ToLower(e.Location)
		if loc == "body" || loc == "" {
			e.Value = nil
			continue
		}
		if v, ok := e.Value.(string); ok && (looksLikeSession(v) || strings.Contains(e.Message, sessionIDPattern)) {
			e.Value = redactAny(v)
		}
		for strings.HasSuffix(loc, "]") && strings.Contains(loc, "[") { // body.sessions[0] names sessions
			loc = loc[:strings.LastIndex(loc, "[")]
		}
		last := loc[strings.LastIndexAny(loc, ".[")+1:]
		for _, name := range secretInputs {
			if strings.Contains(last, name) {
				e.Value = nil
			}
		}
	}
}

// badInputDetail says in one sentence what huma found wrong.
func badInputDetail(msg string, errs []*huma.ErrorDetail) string {
	if len(errs) == 0 {
		return msg
	}
	parts := make([]string, 0, len(errs))
	for _, e := range errs {
		parts = append(parts, fmt.Sprintf("%s: %s", e.Location, e.Message))
	}
	return msg + ": " + strings.Join(parts, "; ") + "; fix the request and send it again (the OpenAPI document at /openapi.json describes every route)"
}

// newProblem is a problem of status with the detail given.
func newProblem(status int, kind, detail string) *Problem {
	return &Problem{Type: problemBase + kind, Title: http.StatusText(status), Status: status, Detail: detail}
}

// invalid is a 400 naming the input at fault (location as huma names it:
// "body.ttl", "path.name", "query.wait").
func invalid(location string, value any, rule string) *Problem {
	p := newProblem(http.StatusBadRequest, "invalid-input", fmt.Sprintf("invalid %s: %s", location, rule))
	p.Errors = []*huma.ErrorDetail{{Location: location, Message: rule, Value: value}}
	scrub(p.Errors)
	return p
}

// problem turns an error of drover's packages into the problem the API
// answers with. where names the request's inputs (a Go field name of an
// InputError maps to its location: "ttl" → "body.ttl").
func problem(err error, where map[string]string) error {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	var ie *drover.InputError
	var sf *drover.StoreFullError
	var qf *queue.QueueFullError
	var held *lock.HeldError
	switch {
	case errors.As(err, &ie):
		loc := where[ie.Field]
		if loc == "" {
			loc = ie.Field
		}
		p = invalid(loc, ie.Value, ie.Rule)
		if p.Errors[0].Value != nil || ie.Value == nil { // else scrubbed: the detail must not repeat it
			p.Detail = strings.Replace(err.Error(), ie.Field, loc, 1)
		}
		return p
	case errors.As(err, &sf):
		p = newProblem(http.StatusInsufficientStorage, "store-full", err.Error())
		p.headers = http.Header{"Retry-After": {"30"}}
		return p
	case errors.As(err, &qf):
		p = newProblem(http.StatusTooManyRequests, "queue-full", err.Error())
		p.headers = http.Header{"Retry-After": {"5"}}
		return p
	case errors.As(err, &held):
		p = newProblem(http.StatusConflict, "lock-held", err.Error())
		st := lockStatusOf(lock.Status{Name: held.Name, Held: true, Holder: held.Holder, Token: held.Token})
		p.Holder = &st
		return p
	case errors.Is(err, lease.ErrFenced), errors.Is(err, lock.ErrNotHeld), errors.Is(err, lease.ErrLost):
		return newProblem(http.StatusConflict, "fenced", err.Error()+": the right this request names is no longer held (its session expired, or another holder took over); claim or acquire again")
	case errors.Is(err, checkpoint.ErrConflict), errors.Is(err, task.ErrConflict), errors.Is(err, checkpoint.ErrBusy), errors.Is(err, registry.ErrDuplicate):
		return newProblem(http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, queue.ErrInboxFull):
		return newProblem(http.StatusConflict, "inbox-full", err.Error())
	case errors.Is(err, queue.ErrFinished), errors.Is(err, queue.ErrWrongStatus), errors.Is(err, queue.ErrNotDead), errors.Is(err, queue.ErrQueueBusy),
		errors.Is(err, queue.ErrQuarantined):
		return newProblem(http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, queue.ErrNotFound), errors.Is(err, queue.ErrNoQueue), errors.Is(err, checkpoint.ErrNotFound),
		errors.Is(err, flow.ErrNoLimit), errors.Is(err, flow.ErrNoQuota), errors.Is(err, flow.ErrNoBreaker), errors.Is(err, registry.ErrNotRegistered):
		return newProblem(http.StatusNotFound, "not-found", err.Error())
	case errors.Is(err, flow.ErrExceedsBurst):
		return newProblem(http.StatusBadRequest, "invalid-input", err.Error())
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		p = newProblem(http.StatusNotFound, "session-not-found", "the session this request names has ended (no keepalive within its TTL, or deleted): "+
			err.Error()+"; create one with POST /v1/sessions")
		return p
	case errors.Is(err, rpctypes.ErrNoSpace):
		p = newProblem(http.StatusInsufficientStorage, "store-full", "etcd's database is full (NOSPACE alarm): "+err.Error()+"; delete data, the server recovers once space is back")
		p.headers = http.Header{"Retry-After": {"30"}}
		return p
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), etcdCode(err) == codes.Canceled, isUnavailable(err):
		p = newProblem(http.StatusServiceUnavailable, "unavailable", "etcd did not answer in time: "+err.Error()+"; retry")
		p.headers = http.Header{"Retry-After": {unavailableRetryAfter()}}
		return p
	}
	return newProblem(http.StatusInternalServerError, "internal", err.Error())
}

// isUnavailable reports an etcd that cannot be reached, has no leader, or
// is between leaders: every error etcd gives the Unavailable code (no
// leader, leader changed, timeouts, stopped). A gRPC client retried reads
// through these; the in-process client of drover server's HTTP API hands
// them over, and the HTTP client retries after Retry-After.
func isUnavailable(err error) bool { return etcdCode(err) == codes.Unavailable }

// etcdCode is the gRPC code of an etcd error (the client's EtcdError, or a
// status the server gave), codes.OK for any other error.
func etcdCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return codes.OK
}

// unavailableRetryAfter is the Retry-After of a 503 for an etcd that did
// not answer: 1 or 2 seconds at random, so that the many requests a stall
// ends at once (every long poll) do not all come back at once.
func unavailableRetryAfter() string { return strconv.Itoa(1 + rand.IntN(2)) }

// retryAfter is the Retry-After header value of d, in whole seconds, at
// least 1.
func retryAfter(secs float64) string {
	if secs < 1 {
		secs = 1
	}
	return strconv.Itoa(int(secs + 0.999))
}
