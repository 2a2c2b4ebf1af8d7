package paxos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/droverhq/drover/paxos/client"
)

// The REST API of a node. The Express lock service's two routes keep their shapes, so its
// clients work unchanged; the rest are added:
//
//	POST   /locks/{id}        {owner, ttl, holder?}  200 {status:"acquired", details:{lockId, owner, expires}, token}
//	                                                  409 {error:"Lock already held", holder:{...}}
//	GET    /locks/{id}                               200 {owner, expires, token, ...}; 404 {error:"Lock not found or expired"}
//	DELETE /locks/{id}        {owner, token}         200 {status:"released"}; 409 not the holder
//	POST   /locks/{id}/renew  {owner, token, ttl}    200 {status:"renewed", expires, token}; 409 not the holder
//	GET    /locks                                    200 {data:[...]}
//	GET    /status                                   200 NodeStatus; 503 {NodeStatus, error} stopped or halted
//	POST   /members           {id, addr?}            200 {status:"added", id, addr}
//	DELETE /members/{id}                             200 {status:"removed", id}
//
// Every lock route, reads included, is a command through the log: a read
// is answered once this node has applied it, so it sees every write that
// finished before it began (linearizable, with no leader lease and no
// clock assumption). ttl is in seconds and may be fractional; expires and
// acquired are the leader's clock in Unix milliseconds. An error is
// {"error": "..."}: 400 for a bad request (nothing is proposed), 504
// {"error":"Consensus timeout"} when no quorum answered within the request
// timeout, 503 when this node is stopped or was removed from the group,
// 422 when the Idempotency-Key was used for a different request.

// Service is what the API serves: *Node implements it.
type Service interface {
	Propose(ctx context.Context, cmd Command) (Result, error)
	Status() NodeStatus
	AddNode(ctx context.Context, p Peer) error
	RemoveNode(ctx context.Context, id NodeID) error
}

var _ Service = (*Node)(nil)

// API limits.
const (
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 1 << 20
	// MaxTTL is the longest lease a request may ask for.
	MaxTTL = 24 * time.Hour
	// MaxOwnerBytes bounds an owner string.
	MaxOwnerBytes = 1024
	// MaxHolderBytes bounds the holder object stored with a grant.
	MaxHolderBytes = 4096
	// DefaultRequestTimeout bounds how long a request waits for consensus.
	DefaultRequestTimeout = 10 * time.Second
	// LeaderHeader names the leader's host:port on every answer of a node
	// that knows it (client.LeaderHeader).
	LeaderHeader = client.LeaderHeader
	// IdempotencyHeader names a request, so a request sent again is
	// applied once (client.IdempotencyHeader).
	IdempotencyHeader = client.IdempotencyHeader
)

// Error messages compatible with the Express lock service's clients.
const (
	msgHeld        = client.MsgHeld
	msgNotFound    = client.MsgNotFound
	msgTimeout     = client.MsgTimeout
	msgOwnerTTL    = client.MsgOwnerTTL
	msgOwnerToken  = "owner and token are required"
	msgNotHolder   = client.MsgNotHolder
	maxIdempotency = 128
)

// APIConfig configures the HTTP API of a node.
type APIConfig struct {
	// RequestTimeout bounds the wait for consensus; zero means 10s.
	RequestTimeout time.Duration
	// Direct, when set, is mounted at /paxos/v1/stream: the direct
	// transport's peer connections.
	Direct http.Handler
	// Logger gets one line per failed request; nil means slog.Default().
	Logger *slog.Logger
}

// api serves the routes of one node.
type api struct {
	node    Service
	timeout time.Duration
	logger  *slog.Logger
	locks   *LockService
}

// NewAPI returns the HTTP handler of node's REST API.
func NewAPI(node Service, cfg APIConfig) http.Handler {
	a := &api{node: node, timeout: cfg.RequestTimeout, logger: cfg.Logger}
	if a.timeout <= 0 {
		a.timeout = DefaultRequestTimeout
	}
	if a.logger == nil {
		a.logger = slog.Default()
	}
	a.locks = &LockService{Proposer: node, Timeout: a.timeout, Logger: a.logger}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /locks/{id}", a.lockRoute(RouteAcquire))
	mux.HandleFunc("GET /locks/{id}", a.lockRoute(RouteGet))
	mux.HandleFunc("DELETE /locks/{id}", a.lockRoute(RouteRelease))
	mux.HandleFunc("/locks/{id}", notAllowed("GET, POST, DELETE"))
	mux.HandleFunc("POST /locks/{id}/renew", a.lockRoute(RouteRenew))
	mux.HandleFunc("/locks/{id}/renew", notAllowed("POST"))
	mux.HandleFunc("GET /locks", a.lockRoute(RouteList))
	mux.HandleFunc("/locks", notAllowed("GET"))
	mux.HandleFunc("GET /status", a.status)
	mux.HandleFunc("/status", notAllowed("GET"))
	mux.HandleFunc("POST /members", a.addMember)
	mux.HandleFunc("/members", notAllowed("POST"))
	mux.HandleFunc("DELETE /members/{id}", a.removeMember)
	mux.HandleFunc("/members/{id}", notAllowed("DELETE"))
	if cfg.Direct != nil {
		mux.Handle(DirectStreamPath, cfg.Direct)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s %s: see GET /status, /locks and /locks/{id}", r.Method, r.URL.Path))
	})
	la, ok := node.(interface{ LeaderAddr() string })
	if !ok {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == DirectStreamPath {
			mux.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(&leaderWriter{ResponseWriter: w, la: la}, r)
	})
}

// leaderWriter sets LeaderHeader as the answer is written, not as the
// request came: a request that waited through an election names the
// leader that answered it, not the one that died.
type leaderWriter struct {
	http.ResponseWriter
	la    interface{ LeaderAddr() string }
	named bool
}

func (w *leaderWriter) name() {
	if !w.named {
		w.named = true
		if a := w.la.LeaderAddr(); a != "" {
			w.Header().Set(LeaderHeader, a)
		}
	}
}

func (w *leaderWriter) WriteHeader(code int) {
	w.name()
	w.ResponseWriter.WriteHeader(code)
}

func (w *leaderWriter) Write(b []byte) (int, error) {
	w.name()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *leaderWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func notAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: use %s", r.Method, r.URL.Path, allow))
	}
}

// lockInfo describes st as of now (the answering node's clock).
func lockInfo(st LockState, now time.Time) LockInfo {
	li := LockInfo{LockID: st.Name, Owner: st.Owner, Token: st.Token, Acquired: st.Acquired, Expires: st.Expires}
	li.TTL = math.Max(0, float64(st.Expires-now.UnixMilli())/1000)
	if st.Meta != "" && json.Valid([]byte(st.Meta)) {
		li.Holder = json.RawMessage(st.Meta)
	}
	return li
}

// lockRoute serves one lock route through the shared LockService.
func (a *api) lockRoute(route LockRoute) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		if route != RouteGet && route != RouteList {
			var ok bool
			if body, ok = readBody(w, r); !ok {
				return
			}
		}
		ans := a.locks.Serve(r.Context(), LockRequest{Route: route, ID: r.PathValue("id"), Body: body, IdempotencyKey: r.Header.Get(IdempotencyHeader)})
		writeJSON(w, ans.Status, ans.Body)
	}
}

// status answers this node's own view, without a round through the log:
// it is what an operator (and a readiness probe) needs when there is no
// quorum. A node that no longer runs (stopped, or halted by a storage
// failure) answers 503 with its last view and why, so a liveness probe
// restarts it.
func (a *api) status(w http.ResponseWriter, r *http.Request) {
	st := a.node.Status()
	if h, ok := a.node.(interface{ Health() error }); ok {
		if err := h.Health(); err != nil {
			msg := "this node is stopped: " + err.Error()
			if errors.Is(err, ErrHalted) {
				msg = "this node halted and takes no part in the group until restarted: " + err.Error()
			}
			writeJSON(w, http.StatusServiceUnavailable, StatusDown{NodeStatus: st, Error: msg})
			return
		}
	}
	writeJSON(w, http.StatusOK, st)
}

// StatusDown is the 503 answer of GET /status: the node's last view, and
// why it no longer runs.
type StatusDown struct {
	NodeStatus
	Error string `json:"error"`
}

func (a *api) addMember(w http.ResponseWriter, r *http.Request) {
	var b memberBody
	if !decode(w, r, &b, "id and addr") {
		return
	}
	if b.ID == nil {
		writeError(w, http.StatusBadRequest, "id is required (the new node's id, a number)")
		return
	}
	if b.Addr != "" {
		if _, _, err := net.SplitHostPort(b.Addr); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("addr %q must be host:port: %v", b.Addr, err))
			return
		}
	}
	p := Peer{ID: NodeID(*b.ID), Addr: b.Addr}
	ctx, cancel := context.WithTimeout(r.Context(), a.timeout)
	defer cancel()
	if err := a.node.AddNode(ctx, p); err != nil {
		a.nodeError(w, r, "add node", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "added", "id": p.ID, "addr": p.Addr})
}

func (a *api) removeMember(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("member id %q must be a node id (a number)", r.PathValue("id")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), a.timeout)
	defer cancel()
	if err := a.node.RemoveNode(ctx, NodeID(n)); err != nil {
		a.nodeError(w, r, "remove node", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "removed", "id": n})
}

// nodeError answers a failed AddNode or RemoveNode.
func (a *api) nodeError(w http.ResponseWriter, r *http.Request, what string, err error) {
	ans := failure(r.Context(), a.logger, what, err)
	writeJSON(w, ans.Status, ans.Body)
}
