package agentserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"
)

// LangGraph's server answers its errors as plain text ("Assistant not
// found"), and LangGraph's SDK makes its error's message of the status
// and the whole body ("HTTP 404: Assistant not found"); it sends no
// Accept header of its own (fetch's "*/*"). drover's answers are RFC 9457
// problems. On the Agent Server's routes, an error is a problem when the
// request's Accept names JSON (application/json, application/problem+json,
// any +json type), and otherwise the problem's detail as text/plain, as
// LangGraph answers it. drover's own routes of the Agent Server (those
// under /v1/, which its runtimes call) always answer problems.

// wantsJSON reports whether an Accept header names a JSON media type.
func wantsJSON(accept string) bool {
	for part := range strings.SplitSeq(accept, ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
			return true
		}
	}
	return false
}

// plainErrors is api whose operations answer their errors as LangGraph's
// plain text when the request does not ask for JSON.
func plainErrors(api huma.API) huma.API { return plainAPI{api} }

type plainAPI struct{ huma.API }

func (a plainAPI) Adapter() huma.Adapter { return plainAdapter{a.API.Adapter()} }

type plainAdapter struct{ huma.Adapter }

func (a plainAdapter) Handle(op *huma.Operation, h func(huma.Context)) {
	if strings.HasPrefix(op.Path, "/v1/") { // drover's own runtime routes: always problems
		a.Adapter.Handle(op, h)
		return
	}
	a.Adapter.Handle(op, func(ctx huma.Context) {
		if wantsJSON(ctx.Header("Accept")) {
			h(ctx)
			return
		}
		pc := &plainContext{humaContext: ctx}
		h(pc)
		pc.flush()
	})
}

// plainContext holds back an error's problem and writes its detail as
// text instead; any other answer passes through.
type plainContext struct {
	humaContext
	ctype  string
	status int
	held   bool // an error: the body is buffered
	buf    bytes.Buffer
}

// Unwrap gives the adapter's own context to what needs it (a streamed
// answer writes the response itself, and writeError decides there).
// humaContext names the embedded context apart from its Context method.
type humaContext = huma.Context

func (c *plainContext) Unwrap() huma.Context { return c.humaContext }

func (c *plainContext) SetHeader(name, value string) {
	if http.CanonicalHeaderKey(name) == "Content-Type" {
		c.ctype = value
		return
	}
	c.humaContext.SetHeader(name, value)
}

func (c *plainContext) SetStatus(code int) {
	c.status = code
	if code >= 400 && isProblem(c.ctype) {
		c.held = true
		return
	}
	if c.ctype != "" {
		c.humaContext.SetHeader("Content-Type", c.ctype)
	}
	c.humaContext.SetStatus(code)
}

func (c *plainContext) BodyWriter() io.Writer {
	if c.held {
		return &c.buf
	}
	return c.humaContext.BodyWriter()
}

// flush writes a held problem as its detail in plain text.
func (c *plainContext) flush() {
	if !c.held {
		return
	}
	c.humaContext.SetHeader("Content-Type", "text/plain; charset=utf-8")
	c.humaContext.SetStatus(c.status)
	_, _ = io.WriteString(c.humaContext.BodyWriter(), plainText(c.buf.Bytes()))
}

func isProblem(ctype string) bool {
	mt, _, _ := mime.ParseMediaType(ctype)
	return mt == "application/problem+json" || mt == "application/json"
}

// plainText is a problem's text: its detail (else its title), and the
// inputs at fault, one a line.
func plainText(raw []byte) string {
	var p struct {
		Title  string `json:"title"`
		Detail string `json:"detail"`
		Errors []struct {
			Location string `json:"location"`
			Message  string `json:"message"`
		} `json:"errors"`
	}
	if json.Unmarshal(raw, &p) != nil {
		return string(raw)
	}
	out := p.Detail
	if out == "" {
		out = p.Title
	}
	for _, e := range p.Errors {
		if e.Location != "" && strings.Contains(out, e.Location) {
			continue // the detail names it already
		}
		out += "\n" + strings.TrimPrefix(e.Location+": ", ": ") + e.Message
	}
	return out
}

// writeError writes err as an RFC 9457 problem, or as its detail in plain
// text when the request (r) does not ask for JSON.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	var se huma.StatusError
	if errors.As(err, &se) {
		status = se.GetStatus()
	} else {
		err = huma.NewError(status, err.Error())
	}
	raw, _ := json.Marshal(err)
	if r != nil && !wantsJSON(r.Header.Get("Accept")) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, plainText(raw))
		return
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write(append(raw, '\n'))
}
