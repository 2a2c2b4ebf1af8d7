package paxos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/paxos/client"
)

// The bodies of the API's requests, how they are read and checked, how
// answers are written, and the lock routes' logic (LockService, below).

// memberBody is the body of POST /members.
type memberBody struct {
	ID   *uint64 `json:"id"`
	Addr string  `json:"addr"`
}

// checkLockID says what is wrong with a lock id of the path, or "".
func checkLockID(id string) string {
	if err := keyspace.CheckName("lock id", id); err != nil {
		return err.Error()
	}
	return ""
}

// checkTTL converts ttl seconds, or says what is wrong with them.
func checkTTL(secs float64) (time.Duration, string) {
	const rule = "ttl must be a number of seconds above 0 and at most 86400 (1 day)"
	if math.IsNaN(secs) || secs <= 0 || secs > MaxTTL.Seconds() {
		return 0, fmt.Sprintf("%s, got %v", rule, secs)
	}
	d := time.Duration(math.Ceil(secs*1000)) * time.Millisecond
	return d, ""
}

// checkOwner says what is wrong with owner, decoded from body, or "".
func checkOwner(owner string, body []byte) string {
	if len(owner) > MaxOwnerBytes {
		return fmt.Sprintf("owner must be at most %d bytes, got %d", MaxOwnerBytes, len(owner))
	}
	if strings.ContainsRune(owner, utf8.RuneError) {
		var raw struct{ Owner json.RawMessage }
		if json.Unmarshal(body, &raw) == nil && ReplacedInvalidText(owner, raw.Owner) {
			return "owner must be UTF-8 text: it holds bytes that are not UTF-8 (or a \\u escape of a lone surrogate)"
		}
	}
	return ""
}

// ReplacedInvalidText reports whether decoded, a string that
// encoding/json decoded from the JSON string raw, holds a U+FFFD that
// stands for bytes that are not UTF-8 (or for a \u escape of a lone
// surrogate) rather than one that raw spelled: encoding/json replaces
// those silently, so a request must be checked against its raw text.
func ReplacedInvalidText(decoded string, raw []byte) bool {
	if !strings.ContainsRune(decoded, utf8.RuneError) {
		return false
	}
	return !utf8.Valid(raw) || loneSurrogateEscape(raw)
}

// loneSurrogateEscape reports whether the JSON string raw holds a \u
// escape of a surrogate that is not half of a pair (a high one followed
// by an escaped low one), reading its escapes in order: "\\ud800" is a
// backslash and text, not an escape.
func loneSurrogateEscape(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if i+1 >= len(raw) || raw[i+1] != 'u' {
			i++ // a two-byte escape: \\, \", \n...
			continue
		}
		r, ok := hex4(raw, i+2)
		if !ok {
			i++
			continue
		}
		i += 5 // the last byte of \uXXXX
		switch {
		case r < 0xd800 || r > 0xdfff:
		case r >= 0xdc00:
			return true // a low surrogate first
		default:
			lo, ok := hex4(raw, i+3)
			if i+2 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' || !ok || lo < 0xdc00 || lo > 0xdfff {
				return true
			}
			i += 6
		}
	}
	return false
}

// hex4 decodes the 4 hex digits at raw[at:].
func hex4(raw []byte, at int) (rune, bool) {
	if at < 0 || at+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// checkHolder compacts the holder object, or says what is wrong with it.
func checkHolder(raw json.RawMessage) (string, string) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil || buf.Len() == 0 || buf.Bytes()[0] != '{' {
		if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return "", ""
		}
		return "", "holder must be a JSON object"
	}
	if buf.Len() > MaxHolderBytes {
		return "", fmt.Sprintf("holder must be at most %d bytes of JSON, got %d", MaxHolderBytes, buf.Len())
	}
	return buf.String(), ""
}

// readBody reads a request body of at most MaxBodyBytes. On failure it
// has answered 400 and returns false.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		writeError(w, http.StatusBadRequest, tooLarge)
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("read the body: %v", err))
		return nil, false
	}
	return b, true
}

const tooLarge = "body larger than 1048576 bytes (1 MiB)"

// decode reads the request body into v (decodeBytes). On failure it has
// answered 400 and returns false.
func decode(w http.ResponseWriter, r *http.Request, v any, fields string) bool {
	b, ok := readBody(w, r)
	if !ok {
		return false
	}
	if msg := decodeBytes(b, v, fields); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return false
	}
	return true
}

// decodeBytes reads one JSON object of at most MaxBodyBytes from body
// into v, refusing unknown fields and wrong types; an empty body is an
// empty object. It returns what is wrong with the body, or "". fields
// lists what the body takes, for the message.
func decodeBytes(body []byte, v any, fields string) string {
	if len(body) > MaxBodyBytes {
		return tooLarge
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			return fmt.Sprintf("body must be one JSON object with %s: data follows it", fields)
		}
	}
	var (
		typeErr *json.UnmarshalTypeError
		synErr  *json.SyntaxError
	)
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return ""
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return fmt.Sprintf("%s must be %s, got a JSON %s", typeErr.Field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	case errors.As(err, &typeErr):
		return fmt.Sprintf("body must be a JSON object with %s, got a JSON %s", fields, typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Sprintf("%s: the body takes %s", strings.TrimPrefix(err.Error(), "json: "), fields)
	case errors.As(err, &synErr) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Sprintf("malformed JSON body: %v", err)
	}
	return fmt.Sprintf("bad body: %v", err)
}

// jsonKind names a Go kind the way a JSON client thinks of it.
func jsonKind(kind string) string {
	switch {
	case kind == "string":
		return "a string"
	case strings.HasPrefix(kind, "int"):
		return "a whole number"
	case strings.HasPrefix(kind, "uint"):
		return "a whole number, 0 or more"
	case strings.HasPrefix(kind, "float"):
		return "a number"
	case kind == "slice", kind == "map", kind == "struct":
		return "a JSON object"
	}
	return "of another type"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// The lock routes' logic, apart from how a request arrives and an answer
// leaves: a node's API serves it over net/http, and drover server serves
// the same logic under its own /locks on its etcd lock table, so the two
// answer every request alike.

// Proposer applies lock commands (acquire, get, release, renew, list) and
// answers their results: *Node through its log; drover server's HTTP API
// on etcd.
type Proposer interface {
	Propose(ctx context.Context, cmd Command) (Result, error)
}

// LockRoute names one of the lock routes.
type LockRoute string

// The lock routes.
const (
	// RouteAcquire is POST /locks/{id}.
	RouteAcquire LockRoute = "acquire"
	// RouteGet is GET /locks/{id}.
	RouteGet LockRoute = "get"
	// RouteRelease is DELETE /locks/{id}.
	RouteRelease LockRoute = "release"
	// RouteRenew is POST /locks/{id}/renew.
	RouteRenew LockRoute = "renew"
	// RouteList is GET /locks.
	RouteList LockRoute = "list"
)

// LockRequest is one request to a lock route.
type LockRequest struct {
	Route LockRoute
	// ID is the path's {id} (none for RouteList).
	ID string
	// Body is the request body, whatever its Content-Type said: JSON is
	// read either way, as curl -d sends it without one.
	Body []byte
	// IdempotencyKey is the request's IdempotencyHeader.
	IdempotencyKey string
}

// LockAnswer is the answer to a lock route: a status and its JSON body
// (one of the client package's response types).
type LockAnswer struct {
	Status int
	Body   any
}

// LockService serves the lock routes on a Proposer.
type LockService struct {
	// Proposer applies the commands.
	Proposer Proposer
	// Timeout bounds each command; zero means DefaultRequestTimeout.
	Timeout time.Duration
	// Logger gets a line per failed command; nil means slog.Default().
	Logger *slog.Logger
	// CheckID, when set, adds rules for the lock id of a route that
	// changes the lock (acquire, release, renew) to the name rules: it
	// returns why id is refused (a 400), or "".
	CheckID func(id string) string
	// Now is the clock that ttl answers are computed with; nil is
	// time.Now.
	Now func() time.Time
}

func errAnswer(status int, msg string) LockAnswer {
	return LockAnswer{Status: status, Body: client.ErrorResponse{Error: msg}}
}

// Serve answers req.
func (s *LockService) Serve(ctx context.Context, req LockRequest) LockAnswer {
	if req.Route != RouteList {
		if msg := checkLockID(req.ID); msg != "" {
			return errAnswer(http.StatusBadRequest, msg)
		}
		if s.CheckID != nil && req.Route != RouteGet {
			if msg := s.CheckID(req.ID); msg != "" {
				return errAnswer(http.StatusBadRequest, msg)
			}
		}
	}
	switch req.Route {
	case RouteAcquire:
		return s.acquire(ctx, req)
	case RouteGet:
		return s.get(ctx, req)
	case RouteRelease, RouteRenew:
		return s.ownerTokenOp(ctx, req)
	case RouteList:
		return s.list(ctx, req)
	}
	return errAnswer(http.StatusNotFound, fmt.Sprintf("no lock route %q", req.Route))
}

func (s *LockService) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *LockService) acquire(ctx context.Context, req LockRequest) LockAnswer {
	var b client.AcquireBody
	if msg := decodeBytes(req.Body, &b, "owner, ttl and holder"); msg != "" {
		return errAnswer(http.StatusBadRequest, msg)
	}
	if b.Owner == nil || *b.Owner == "" || b.TTL == nil || *b.TTL == 0 {
		return errAnswer(http.StatusBadRequest, msgOwnerTTL)
	}
	ttl, msg := checkTTL(*b.TTL)
	if msg == "" {
		msg = checkOwner(*b.Owner, req.Body)
	}
	var meta string
	if msg == "" && b.Holder != nil {
		meta, msg = checkHolder(*b.Holder)
	}
	if msg != "" {
		return errAnswer(http.StatusBadRequest, msg)
	}
	cmd := Command{Op: OpAcquire, Lock: req.ID, Owner: *b.Owner, TTL: ttl.Milliseconds(), Meta: meta}
	res, ans, ok := s.propose(ctx, req, cmd)
	if !ok {
		return ans
	}
	switch res.Code {
	case CodeOK:
		li := lockInfo(res.Lock, s.now())
		return LockAnswer{Status: http.StatusOK, Body: AcquireResponse{Status: "acquired", Token: li.Token,
			Details: GrantDetails{LockID: req.ID, Owner: li.Owner, Expires: li.Expires, Acquired: li.Acquired, Holder: li.Holder}}}
	case CodeHeld:
		li := lockInfo(res.Lock, s.now())
		return LockAnswer{Status: http.StatusConflict, Body: client.ErrorResponse{Error: msgHeld, Holder: &li}}
	}
	return s.unexpected(cmd, res)
}

func (s *LockService) get(ctx context.Context, req LockRequest) LockAnswer {
	cmd := Command{Op: OpGet, Lock: req.ID}
	res, ans, ok := s.propose(ctx, req, cmd)
	if !ok {
		return ans
	}
	switch res.Code {
	case CodeOK:
		return LockAnswer{Status: http.StatusOK, Body: lockInfo(res.Lock, s.now())}
	case CodeNotFound:
		return errAnswer(http.StatusNotFound, msgNotFound)
	}
	return s.unexpected(cmd, res)
}

// ownerTokenOp serves release and renew: both name the holder by owner
// and token, and both answer 409 to anyone else.
func (s *LockService) ownerTokenOp(ctx context.Context, req LockRequest) LockAnswer {
	op, fields := OpRelease, "owner and token"
	if req.Route == RouteRenew {
		op, fields = OpRenew, "owner, token and ttl"
	}
	var b client.OwnerTokenBody
	if msg := decodeBytes(req.Body, &b, fields); msg != "" {
		return errAnswer(http.StatusBadRequest, msg)
	}
	if b.Owner == nil || *b.Owner == "" || b.Token == nil || *b.Token == 0 {
		return errAnswer(http.StatusBadRequest, msgOwnerToken)
	}
	if msg := checkOwner(*b.Owner, req.Body); msg != "" {
		return errAnswer(http.StatusBadRequest, msg)
	}
	cmd := Command{Op: op, Lock: req.ID, Owner: *b.Owner, Token: *b.Token}
	switch {
	case op == OpRelease && b.TTL != nil:
		return errAnswer(http.StatusBadRequest, `unknown field "ttl": a release takes owner and token`)
	case op == OpRenew && (b.TTL == nil || *b.TTL == 0):
		return errAnswer(http.StatusBadRequest, "owner, token and ttl are required")
	case op == OpRenew:
		ttl, msg := checkTTL(*b.TTL)
		if msg != "" {
			return errAnswer(http.StatusBadRequest, msg)
		}
		cmd.TTL = ttl.Milliseconds()
	}
	res, ans, ok := s.propose(ctx, req, cmd)
	if !ok {
		return ans
	}
	switch {
	case res.Code == CodeOK && op == OpRelease:
		return LockAnswer{Status: http.StatusOK, Body: client.StatusResponse{Status: "released"}}
	case res.Code == CodeOK:
		return LockAnswer{Status: http.StatusOK, Body: client.RenewResponse{Status: "renewed", Expires: res.Lock.Expires, Token: res.Lock.Token}}
	case res.Code == CodeNotHeld:
		body := client.ErrorResponse{Error: msgNotHolder + ": the lock is free"}
		if res.Lock.Owner != "" {
			li := lockInfo(res.Lock, s.now())
			body = client.ErrorResponse{Error: msgNotHolder + ": it is held by another owner or token", Holder: &li}
		}
		return LockAnswer{Status: http.StatusConflict, Body: body}
	}
	return s.unexpected(cmd, res)
}

func (s *LockService) list(ctx context.Context, req LockRequest) LockAnswer {
	cmd := Command{Op: OpList}
	res, ans, ok := s.propose(ctx, req, cmd)
	if !ok {
		return ans
	}
	if res.Code != CodeOK {
		return s.unexpected(cmd, res)
	}
	now := s.now()
	data := make([]LockInfo, 0, len(res.Locks))
	for _, st := range res.Locks {
		data = append(data, lockInfo(st, now))
	}
	return LockAnswer{Status: http.StatusOK, Body: client.ListResponse{Data: data}}
}

// propose runs cmd within the timeout. On failure it returns the answer
// to give and false.
func (s *LockService) propose(ctx context.Context, req LockRequest, cmd Command) (Result, LockAnswer, bool) {
	key := req.IdempotencyKey
	if len(key) > maxIdempotency || strings.ContainsFunc(key, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
		return Result{}, errAnswer(http.StatusBadRequest, fmt.Sprintf("%s must be at most %d printable ASCII characters without spaces", IdempotencyHeader, maxIdempotency)), false
	}
	if key != "" {
		cmd.ID = "http:" + key
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := s.Proposer.Propose(pctx, cmd)
	if err != nil {
		return Result{}, failure(ctx, s.logger(), string(cmd.Op), err), false
	}
	if res.Code == CodeReusedID {
		return Result{}, errAnswer(http.StatusUnprocessableEntity, fmt.Sprintf(
			"%s %s was used for a different request (applied at slot %d): send a new key with each new request, the same key only to repeat one",
			IdempotencyHeader, key, res.Index)), false
	}
	return res, LockAnswer{}, true
}

func (s *LockService) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

// failure answers a failed Propose, AddNode or RemoveNode of a request
// whose context is ctx.
func failure(ctx context.Context, logger *slog.Logger, what string, err error) LockAnswer {
	switch {
	case errors.Is(err, ErrTimeout) && ctx.Err() == nil:
		return errAnswer(http.StatusGatewayTimeout, msgTimeout)
	case errors.Is(err, ErrRemoved):
		return errAnswer(http.StatusServiceUnavailable, "this node was removed from the group: send requests to another node")
	case errors.Is(err, ErrStopped):
		return errAnswer(http.StatusServiceUnavailable, "this node is stopping: send requests to another node")
	case ctx.Err() != nil:
		// The client went away; nobody reads this answer.
		return errAnswer(http.StatusServiceUnavailable, "request cancelled by the client")
	case what == "add node" || what == "remove node":
		return errAnswer(http.StatusConflict, err.Error())
	}
	logger.Error("paxos: request failed", "op", what, "err", err)
	return errAnswer(http.StatusInternalServerError, fmt.Sprintf("%s failed: %v", what, err))
}

// unexpected answers a result code the operation cannot give.
func (s *LockService) unexpected(cmd Command, res Result) LockAnswer {
	s.logger().Error("paxos: unexpected result", "op", cmd.Op, "lock", cmd.Lock, "code", res.Code, "err", res.Err)
	return errAnswer(http.StatusInternalServerError, fmt.Sprintf("%s answered %s %s", cmd.Op, res.Code, res.Err))
}
