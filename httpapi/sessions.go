package httpapi

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/paxos"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultSessionTTL is a session's TTL when the request names none.
const DefaultSessionTTL = 15

// SessionBody is a session as the API returns it.
type SessionBody struct {
	ID        string    `json:"id" doc:"The session's id: its etcd lease in hex, a dot, and a secret. Pass it to routes that hold something under the session; keep it secret, it proves what the session holds."`
	Name      string    `json:"name,omitempty" doc:"The name given at creation (a worker's id), shown as the holder of what the session holds."`
	Host      string    `json:"host,omitempty" doc:"The host given at creation, shown with the name."`
	PID       int       `json:"pid,omitempty" doc:"The process id given at creation, shown with the name."`
	TTL       int64     `json:"ttl" doc:"Seconds the session lives without a keepalive."`
	ExpiresAt time.Time `json:"expires_at" doc:"When the session ends unless kept alive."`
}

// sessionRecord is the value of a session's key.
type sessionRecord struct {
	// Secret is the SHA-256, in hex, of the id's secret part.
	Secret    string    `json:"secret_sha256"`
	Name      string    `json:"name,omitempty"`
	Host      string    `json:"host,omitempty"`
	PID       int       `json:"pid,omitempty"`
	TTL       int64     `json:"ttl"`
	CreatedAt time.Time `json:"created_at"`
}

// sessionIDPattern is the pattern of sessionIDPath's id, as its tag
// says: scrub knows an input that must be a session id by it.
const sessionIDPattern = `^[0-9a-f]{1,16}\.[a-z2-7]{16,64}$`

type sessionIDPath struct {
	ID string `path:"id" pattern:"^[0-9a-f]{1,16}\\.[a-z2-7]{16,64}$" doc:"The session's id."`
}

type sessionOutput struct {
	Body SessionBody
}

// session is a session as a request uses it: the lease it stands for, the
// name it holds things under.
type session struct {
	id    clientv3.LeaseID
	name  string
	host  string
	pid   int
	lease *lease.Lease
}

// holder is who holds what the session holds, as lock records show it:
// the session's name, host and pid as its creation gave them (the
// client's, not the server's). A session created without a name is
// named by its host and pid, or "http-session": never by its id, which
// with a token proves holdings.
func (s *session) holder() lock.Holder {
	h := lock.Holder{ID: s.name, Host: s.host, PID: s.pid}
	switch {
	case h.ID != "":
	case h.Host != "" && h.PID != 0:
		h.ID = fmt.Sprintf("%s:%d", h.Host, h.PID)
	case h.Host != "":
		h.ID = h.Host
	default:
		h.ID = "http-session"
	}
	return h
}

func (s *Server) sessionRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "create-session", Method: http.MethodPost, Path: "/v1/sessions", Tags: []string{"sessions"},
		Summary: "Create a session",
		Description: "A session is an etcd lease that the client keeps alive with keepalive requests. Everything held under it " +
			"(locks, claims, registrations, quota slots) is freed by etcd within its TTL once the client stops: exactly as for Go clients.",
		DefaultStatus: http.StatusCreated,
	}, s.createSession)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-session", Method: http.MethodGet, Path: "/v1/sessions/{id}", Tags: []string{"sessions"},
		Summary: "Read a session: its TTL and when it expires",
	}, s.getSession)
	huma.Register(s.api, huma.Operation{
		OperationID: "keepalive-session", Method: http.MethodPost, Path: "/v1/sessions/{id}/keepalive", Tags: []string{"sessions"},
		Summary:     "Keep a session alive",
		Description: "Renews the session's TTL from now. Send one every TTL/3; 404 means the session ended (expired or deleted) and everything held under it is gone.",
	}, s.keepaliveSession)
	huma.Register(s.api, huma.Operation{
		OperationID: "delete-session", Method: http.MethodDelete, Path: "/v1/sessions/{id}", Tags: []string{"sessions"},
		Summary:       "End a session: everything held under it is released at once",
		DefaultStatus: http.StatusNoContent,
	}, s.deleteSession)
}

// createSessionInput is an alias of an unnamed struct, as the route's
// document names its body after the operation ("Create-sessionRequest").
type createSessionInput = struct {
	Body struct {
		TTL  int64  `json:"ttl,omitempty" minimum:"1" maximum:"86400" doc:"Seconds; default 15. etcd raises TTLs under its minimum (about 2 s)."`
		Name string `json:"name,omitempty" maxLength:"128" doc:"A name for what holds the session (a worker's id): lock records show it as the holder."`
		Host string `json:"host,omitempty" maxLength:"255" doc:"The host the client runs on, shown with the name as the holder of what the session holds."`
		PID  int    `json:"pid,omitempty" minimum:"0" maximum:"4294967295" doc:"The client's process id, shown with the name and host."`
	}
	RawBody []byte
}

// checkSessionText refuses a name or host that is not UTF-8 text:
// encoding/json would have replaced its bytes with U+FFFD silently.
func checkSessionText(in *createSessionInput) error {
	var raw struct{ Name, Host json.RawMessage }
	if json.Unmarshal(in.RawBody, &raw) != nil {
		return nil // huma decoded it: a duplicate key at most, which it took
	}
	for _, f := range []struct {
		loc, v string
		raw    json.RawMessage
	}{{"body.name", in.Body.Name, raw.Name}, {"body.host", in.Body.Host, raw.Host}} {
		if paxos.ReplacedInvalidText(f.v, f.raw) {
			return invalid(f.loc, f.v, "must be UTF-8 text: it holds bytes that are not UTF-8 (or a \\u escape of a lone surrogate)")
		}
	}
	return nil
}

// createSession grants the session's lease and records the session under
// it.
func (s *Server) createSession(ctx context.Context, in *createSessionInput) (*sessionOutput, error) {
	if err := checkSessionText(in); err != nil {
		return nil, err
	}
	ttl := in.Body.TTL
	if ttl == 0 {
		ttl = DefaultSessionTTL
	}
	sent := time.Now()
	g, err := s.grant(ctx, ttl)
	if err != nil {
		return nil, problem(fmt.Errorf("grant a %d s lease: %w", ttl, err), nil)
	}
	secret := strings.ToLower(crand.Text())
	rec := sessionRecord{Secret: secretSum(secret), Name: in.Body.Name, Host: in.Body.Host, PID: in.Body.PID, TTL: g.TTL, CreatedAt: sent.UTC()}
	val, _ := json.Marshal(rec)
	leaseHex := strconv.FormatInt(int64(g.ID), 16)
	id := leaseHex + "." + secret
	if _, err := s.cli.Put(ctx, s.keys(ctx).Session(leaseHex), string(val), clientv3.WithLease(g.ID)); err != nil {
		s.revokeGranted(ctx, g.ID)
		return nil, problem(fmt.Errorf("record the session: %w", err), nil)
	}
	return &sessionOutput{Body: SessionBody{ID: id, Name: rec.Name, Host: rec.Host, PID: rec.PID, TTL: g.TTL, ExpiresAt: sent.Add(time.Duration(g.TTL) * time.Second).UTC()}}, nil
}

// getSession reads the session's lease's time to live.
func (s *Server) getSession(ctx context.Context, in *sessionIDPath) (*sessionOutput, error) {
	sess, err := s.session(ctx, "path.id", in.ID)
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	t, err := s.cli.TimeToLive(ctx, sess.id)
	if err != nil {
		return nil, problem(err, nil)
	}
	if t.TTL < 0 { // etcd says -1 for a lease it no longer has; 0 is under a second left
		s.sessions.forget(s.nsOf(ctx), leaseHexOf(in.ID))
		return nil, sessionGone(in.ID, s.nsOf(ctx))
	}
	return &sessionOutput{Body: SessionBody{ID: in.ID, Name: sess.name, Host: sess.host, PID: sess.pid, TTL: t.GrantedTTL, ExpiresAt: sent.Add(time.Duration(t.TTL) * time.Second).UTC()}}, nil
}

// keepaliveSession renews the session's lease once.
func (s *Server) keepaliveSession(ctx context.Context, in *sessionIDPath) (*sessionOutput, error) {
	sess, err := s.session(ctx, "path.id", in.ID)
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	k, err := s.cli.KeepAliveOnce(ctx, sess.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.sessions.forget(s.nsOf(ctx), leaseHexOf(in.ID))
		return nil, sessionGone(in.ID, s.nsOf(ctx))
	}
	if err != nil {
		return nil, problem(err, nil)
	}
	return &sessionOutput{Body: SessionBody{ID: in.ID, Name: sess.name, Host: sess.host, PID: sess.pid, TTL: k.TTL, ExpiresAt: sent.Add(time.Duration(k.TTL) * time.Second).UTC()}}, nil
}

// deleteSession revokes the session's lease, and with it everything held
// under it.
func (s *Server) deleteSession(ctx context.Context, in *sessionIDPath) (*struct{}, error) {
	s.sessions.forget(s.nsOf(ctx), leaseHexOf(in.ID))
	sess, err := s.session(ctx, "path.id", in.ID)
	if err != nil {
		return nil, err
	}
	s.sessions.forget(s.nsOf(ctx), leaseHexOf(in.ID))
	if _, err := s.cli.Revoke(ctx, sess.id); errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil, sessionGone(in.ID, s.nsOf(ctx))
	} else if err != nil {
		return nil, problem(err, nil)
	}
	return nil, nil
}

// sessionIDRule is the rule a malformed session id breaks.
const sessionIDRule = "must be a session id: the id POST /v1/sessions returned (its lease in hex, a dot, its secret)"

// parseSessionID splits a session id into its lease and its secret.
func parseSessionID(id string) (lid clientv3.LeaseID, leaseHex, secret string, ok bool) {
	leaseHex, secret, found := strings.Cut(id, ".")
	n, err := strconv.ParseUint(leaseHex, 16, 64)
	if !found || err != nil || n == 0 || n > 1<<63-1 || len(leaseHex) > 16 || len(secret) < 16 || len(secret) > 64 {
		return 0, "", "", false
	}
	return clientv3.LeaseID(n), leaseHex, secret, true
}

// secretSum is what a session's record keeps of its secret.
func secretSum(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// session reads session id of the request's namespace: 404 when it does
// not exist there (expired, ended, or another namespace's) or when the
// id's secret is not the session's. The id's secret is what proves a
// session: the lease alone shows in places (a lock contender's name), the
// secret only in the answer to the session's creation; a malformed id is a
// 400 at location (where the request holds it). A session seen
// before is taken from the server's cache without a read: a session's
// namespace, name and secret never change, and etcd itself refuses to bind
// a key to a lease that ended, so a stale entry can only cost a later
// error (mapped to the same 404), never a wrong answer.
func (s *Server) session(ctx context.Context, location, id string) (*session, error) {
	lid, leaseHex, secret, ok := parseSessionID(id)
	if !ok {
		return nil, invalid(location, id, sessionIDRule)
	}
	ns := s.nsOf(ctx)
	rec, ok := s.sessions.get(ns, leaseHex)
	if !ok {
		var err error
		if rec, err = s.readSession(ctx, id, leaseHex, lid); err != nil {
			return nil, err
		}
		s.sessions.put(ns, leaseHex, rec)
	}
	if subtle.ConstantTimeCompare([]byte(secretSum(secret)), []byte(rec.Secret)) != 1 {
		return nil, sessionGone(id, ns)
	}
	ttl := time.Duration(max(rec.TTL, 1)) * time.Second
	// The session may have been renewed just now: it lasts at most a TTL
	// from now (a renewal resets it to that).
	sess := &session{id: lid, name: rec.Name, host: rec.Host, pid: rec.PID}
	sess.lease = lease.Attach(s.cli, sess.id, ttl, time.Now().Add(ttl))
	return sess, nil
}

// sessionLease is the lease of session id for a route that writes under
// something the session held (an ack, a fenced write): a session that
// does not exist is a 409 there, since what it held went with it, and a
// malformed id a 400 at location.
func (s *Server) sessionLease(ctx context.Context, location, id string) (clientv3.LeaseID, error) {
	if _, _, _, ok := parseSessionID(id); !ok {
		return 0, invalid(location, id, sessionIDRule)
	}
	sess, err := s.session(ctx, location, id)
	var p *Problem
	if errors.As(err, &p) && p.Status == http.StatusNotFound {
		return 0, problem(fmt.Errorf("session %s: %w: the session ended, and what it held with it", redact(id), lease.ErrFenced), nil)
	}
	if err != nil {
		return 0, err
	}
	return sess.id, nil
}

// redact shows a session id without its secret.
func redact(id string) string {
	if h, _, ok := strings.Cut(id, "."); ok {
		return h + ".…"
	}
	return id
}

// readSession reads the record of session id (lease leaseHex) from etcd.
func (s *Server) readSession(ctx context.Context, id, leaseHex string, lid clientv3.LeaseID) (sessionRecord, error) {
	var rec sessionRecord
	g, err := s.cli.Get(ctx, s.keys(ctx).Session(leaseHex))
	if err != nil {
		return rec, problem(err, nil)
	}
	if len(g.Kvs) == 0 || g.Kvs[0].Lease != int64(lid) {
		return rec, sessionGone(id, s.nsOf(ctx))
	}
	_ = json.Unmarshal(g.Kvs[0].Value, &rec)
	return rec, nil
}

// sessionCache remembers the records of sessions seen, by namespace and
// id; it forgets everything past maxCachedSessions.
type sessionCache struct {
	mu sync.Mutex
	m  map[string]sessionRecord
}

const maxCachedSessions = 100_000

func (c *sessionCache) get(ns, id string) (sessionRecord, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.m[ns+"/"+id]
	return r, ok
}

func (c *sessionCache) put(ns, id string, r sessionRecord) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedSessions {
		c.m = map[string]sessionRecord{}
	}
	c.m[ns+"/"+id] = r
}

func (c *sessionCache) forget(ns, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, ns+"/"+id)
}

// sessionGone is the 404 of a session that does not exist.
func sessionGone(id, ns string) *Problem {
	p := newProblem(http.StatusNotFound, "session-not-found",
		fmt.Sprintf("session %s does not exist in namespace %s: it expired (no keepalive within its TTL), was deleted, belongs to another namespace, or the id is not the one its creation returned; create one with POST /v1/sessions", redact(id), ns))
	p.Errors = []*huma.ErrorDetail{{Location: "session", Value: redact(id), Message: "no such session"}}
	return p
}

// leaseHexOf is the lease part of a session id, which keys the cache.
func leaseHexOf(id string) string { h, _, _ := strings.Cut(id, "."); return h }

// cleanupContext is the context of a cleanup a request does once its work
// failed (revoking the lease it granted, releasing what it claimed): not
// cancelled with ctx, since it runs when the request's own context has
// ended, and bounded by cleanupTimeout, so that an etcd that does not
// answer keeps the request little longer than its bound. What a cleanup
// leaves undone ends with its lease's TTL.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// revokeGranted revokes a lease the request granted and will not use,
// within cleanupTimeout; if etcd does not answer, the lease expires with
// its TTL.
func (s *Server) revokeGranted(ctx context.Context, id clientv3.LeaseID) {
	c, cancel := cleanupContext(ctx)
	defer cancel()
	_, _ = s.cli.Revoke(c, id)
}

// grant grants a lease of ttl seconds for the request.
func (s *Server) grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	g, err := s.cli.Grant(ctx, ttl)
	if err == nil {
		if hook := afterGrant.Load(); hook != nil {
			(*hook)(ctx)
		}
	}
	return g, err
}

// afterGrant, when set (by tests), runs when a request was granted a
// lease.
var afterGrant atomic.Pointer[func(ctx context.Context)]
