package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Config configures the routes. Etcd and Namespace are required.
type Config struct {
	// Etcd stores assistants and threads.
	Etcd *clientv3.Client
	// Namespace returns the namespace of a request, as the API's
	// authentication resolved it.
	Namespace func(ctx context.Context) string
	// ReadOnly, if set, is called on each route that only reads but is a
	// POST (searches and counts), so that the API can let read-only
	// tokens call it.
	ReadOnly func(op *huma.Operation)
	// Now is the clock of created_at and updated_at; default time.Now.
	Now func() time.Time
	// LockThread takes lock name under session (an id of POST
	// /v1/sessions) as POST /v1/locks/{name} does, waiting in line up to
	// wait: a run's start takes its thread's lock with it. Without it the
	// start route is not served (runtimes take the lock themselves).
	LockThread func(ctx context.Context, session, name string, wait time.Duration) (RunLock, error)
	// Claims keeps the claims of runs' tasks that a run's start read, for
	// its outcome (and, shared with the stream route, its appends) to
	// write under without reading them again (see stream.ClaimCache);
	// default a cache of the routes' own.
	Claims *stream.ClaimCache
	// Truncate serves POST /internal/truncate, the reset LangGraph's test
	// suite calls: only for a server started for tests (TruncateEnv).
	Truncate bool
}

// Validate reports the first field that is not usable.
func (c Config) Validate() error {
	if c.Etcd == nil {
		return errors.New("agentserver: Config.Etcd must be an etcd client")
	}
	if c.Namespace == nil {
		return errors.New("agentserver: Config.Namespace must resolve a request's namespace")
	}
	return nil
}

// server holds what every handler needs.
type server struct {
	cfg Config
	ids idSource
	// indexed holds the namespaces (by their runs' prefix) whose index of
	// active runs is known complete: see ensureRunIndex.
	indexed sync.Map
}

// tag names the routes' group in the OpenAPI document.
const (
	tagAssistants = "Agent Server: assistants"
	tagThreads    = "Agent Server: threads"
)

// Register adds the Agent Server's routes to api, at its root as
// LangGraph serves them (/assistants, /threads).
func Register(api huma.API, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Claims == nil {
		cfg.Claims = new(stream.ClaimCache)
	}
	s := &server{cfg: cfg}
	api = plainErrors(api) // LangGraph's plain-text errors unless JSON is asked for: plaintext.go
	s.assistantRoutes(api)
	s.threadRoutes(api)
	s.graphRoutes(api)
	s.runRoutes(api)
	s.runStopsRoute(api)
	s.storeRoutes(api)
	s.cronRoutes(api)
	if cfg.Truncate {
		s.truncateRoute(api)
	}
	return nil
}

// space is the key space of the request's namespace. The API's
// authentication checked the name, so an error here is the server's own
// fault: a 500, never a silent fall back to another namespace.
func (s *server) space(ctx context.Context) (keyspace.Space, error) {
	ns := s.cfg.Namespace(ctx)
	sp, err := keyspace.New(ns)
	if err != nil {
		return keyspace.Space{}, huma.NewError(http.StatusInternalServerError, fmt.Sprintf("agentserver: the request's namespace %q is not usable: %v", ns, err))
	}
	return sp, nil
}

// readOnly marks op as one that only reads.
func (s *server) readOnly(op huma.Operation) huma.Operation {
	if op.Metadata == nil {
		op.Metadata = map[string]any{}
	}
	if s.cfg.ReadOnly != nil {
		s.cfg.ReadOnly(&op)
	}
	return op
}

// now is the server's clock in UTC, to the millisecond as LangGraph's.
func (s *server) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Millisecond) }

// badInput is a 400 naming the input at fault and the rule it broke.
func badInput(location string, value any, rule string) error {
	return huma.NewError(http.StatusBadRequest, fmt.Sprintf("%s %s", location, rule),
		&huma.ErrorDetail{Location: location, Value: value, Message: rule})
}

// notBuilt is a 501 for an input this server does not serve yet.
func notBuilt(location, what string) error {
	return huma.NewError(http.StatusNotImplemented, fmt.Sprintf("%s: %s is not served by this server yet (docs/agent-server.md says what is)", location, what),
		&huma.ErrorDetail{Location: location, Message: "not served yet"})
}

// etcdError is a 503 for a store that did not answer, with Retry-After.
func etcdError(doing string, err error) error {
	return withHeaders{huma.NewError(http.StatusServiceUnavailable, fmt.Sprintf("%s: etcd did not answer (%v); retry", doing, err)),
		http.Header{"Retry-After": {"1"}}}
}

// storeFull is the 507 of a write the store guard refused (err is its
// *drover.StoreFullError), with Retry-After as the API's other writes.
func storeFull(err error) error {
	return withHeaders{huma.NewError(http.StatusInsufficientStorage, err.Error()), http.Header{"Retry-After": {"30"}}}
}

// guardOf is the error the store guard's key, read in a transaction's
// Else by storeguard.GetOp as its response i, stands for: nil when the
// guard did not refuse.
func guardOf(resp *clientv3.TxnResponse, i int) error {
	if len(resp.Responses) <= i {
		return nil
	}
	if err := storeguard.FromRange(resp.Responses[i].GetResponseRange()); err != nil {
		return storeFull(err)
	}
	return nil
}

// undecodable is the 500 of a stored record that does not decode. It
// names the record by its id, never by its key in etcd.
func undecodable(what, id string, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	rule := "is not JSON"
	if errors.As(err, &te) {
		rule = fmt.Sprintf("has a %s where a %s belongs", te.Value, te.Type)
	} else if !errors.As(err, &se) {
		rule = "does not decode"
	}
	return huma.NewError(http.StatusInternalServerError, fmt.Sprintf("agentserver: the stored %s %s %s", what, id, rule))
}

// idOf is the last part of a key: the id of what it stores.
func idOf(key []byte) string {
	k := string(key)
	return k[strings.LastIndex(k, "/")+1:]
}

// withHeaders is an error whose answer carries headers (huma sends a
// HeadersError's headers; the problem itself is the wrapped error).
type withHeaders struct {
	error
	h http.Header
}

func (e withHeaders) Unwrap() error           { return e.error }
func (e withHeaders) GetHeaders() http.Header { return e.h }

// maxAttempts bounds the retries of a change that raced another.
const maxAttempts = 16

// errRaced is a 409 for a change that lost maxAttempts races in a row.
func errRaced(what string) error {
	return huma.NewError(http.StatusConflict, fmt.Sprintf("%s changed under %d attempts in a row; retry", what, maxAttempts))
}

// createOnce is the create of a keyed record (an assistant, a thread):
// one transaction writes ops (the record at key, and what goes with it)
// if key is absent and the store guard allows (507 otherwise, whether or
// not key is taken). When key is taken it answers the record stored,
// decoded, with doNothing (LangGraph's if_exists do_nothing), else a 409
// in LangGraph's words for what ("Assistant", "Thread"). It answers nil
// when it created the record.
func createOnce[T any](ctx context.Context, s *server, sp keyspace.Space, what, id, key string, ops []clientv3.Op, doNothing bool) (*T, error) {
	resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), storeguard.NotFull(sp)).
		Then(ops...).Else(clientv3.OpGet(key), storeguard.GetOp(sp)).Commit()
	if err != nil {
		return nil, etcdError("creating the "+strings.ToLower(what), err)
	}
	if resp.Succeeded {
		return nil, nil
	}
	if err := guardOf(resp, 1); err != nil { // the guard refused, whether or not the id is taken
		return nil, err
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 { // neither taken nor refused by the guard: a race with a delete or the guard
		return nil, errRaced("the " + strings.ToLower(what))
	}
	if !doNothing {
		return nil, huma.NewError(http.StatusConflict, what+" already exists: if_exists is raise (send do_nothing to get the existing one)")
	}
	var old T
	if err := json.Unmarshal(kvs[0].Value, &old); err != nil {
		return nil, undecodable(strings.ToLower(what), id, err)
	}
	return &old, nil
}
