package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/lease"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultSessionTTL is a session's TTL when the request names none.
const DefaultSessionTTL = 15

// SessionBody is a session as the API returns it.
type SessionBody struct {
	ID        string    `json:"id" doc:"The session's id: its etcd lease, in hex. Pass it to routes that hold something under the session."`
	Name      string    `json:"name,omitempty" doc:"The name given at creation (a worker's id), shown as the holder of what the session holds."`
	TTL       int64     `json:"ttl" doc:"Seconds the session lives without a keepalive."`
	ExpiresAt time.Time `json:"expires_at" doc:"When the session ends unless kept alive."`
}

// sessionRecord is the value of a session's key.
type sessionRecord struct {
	Name      string    `json:"name,omitempty"`
	TTL       int64     `json:"ttl"`
	CreatedAt time.Time `json:"created_at"`
}

type sessionIDPath struct {
	ID string `path:"id" pattern:"^[0-9a-f]{1,16}$" doc:"The session's id."`
}

type sessionOutput struct {
	Body SessionBody
}

// session is a session as a request uses it: the lease it stands for, the
// name it holds things under.
type session struct {
	id    clientv3.LeaseID
	name  string
	lease *lease.Lease
}

func (s *Server) sessionRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "create-session", Method: http.MethodPost, Path: "/v1/sessions", Tags: []string{"sessions"},
		Summary: "Create a session",
		Description: "A session is an etcd lease that the client keeps alive with keepalive requests. Everything held under it " +
			"(locks, claims, registrations, quota slots) is freed by etcd within its TTL once the client stops: exactly as for Go clients.",
		DefaultStatus: http.StatusCreated,
	}, func(ctx context.Context, in *struct {
		Body struct {
			TTL  int64  `json:"ttl,omitempty" minimum:"1" maximum:"86400" doc:"Seconds; default 15. etcd raises TTLs under its minimum (about 2 s)."`
			Name string `json:"name,omitempty" maxLength:"128" doc:"A name for what holds the session (a worker's id)."`
		}
	}) (*sessionOutput, error) {
		ttl := in.Body.TTL
		if ttl == 0 {
			ttl = DefaultSessionTTL
		}
		sent := time.Now()
		g, err := s.cli.Grant(ctx, ttl)
		if err != nil {
			return nil, problem(fmt.Errorf("grant a %d s lease: %w", ttl, err), nil)
		}
		rec := sessionRecord{Name: in.Body.Name, TTL: g.TTL, CreatedAt: sent.UTC()}
		val, _ := json.Marshal(rec)
		id := strconv.FormatInt(int64(g.ID), 16)
		if _, err := s.cli.Put(ctx, s.keys(ctx).Session(id), string(val), clientv3.WithLease(g.ID)); err != nil {
			_, _ = s.cli.Revoke(context.WithoutCancel(ctx), g.ID)
			return nil, problem(fmt.Errorf("record the session: %w", err), nil)
		}
		return &sessionOutput{Body: SessionBody{ID: id, Name: rec.Name, TTL: g.TTL, ExpiresAt: sent.Add(time.Duration(g.TTL) * time.Second).UTC()}}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "get-session", Method: http.MethodGet, Path: "/v1/sessions/{id}", Tags: []string{"sessions"},
		Summary: "Read a session: its TTL and when it expires",
	}, func(ctx context.Context, in *sessionIDPath) (*sessionOutput, error) {
		sess, err := s.session(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		sent := time.Now()
		t, err := s.cli.TimeToLive(ctx, sess.id)
		if err != nil {
			return nil, problem(err, nil)
		}
		if t.TTL < 0 { // etcd says -1 for a lease it no longer has; 0 is under a second left
			s.sessions.forget(s.nsOf(ctx), in.ID)
			return nil, sessionGone(in.ID, s.nsOf(ctx))
		}
		return &sessionOutput{Body: SessionBody{ID: in.ID, Name: sess.name, TTL: t.GrantedTTL, ExpiresAt: sent.Add(time.Duration(t.TTL) * time.Second).UTC()}}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "keepalive-session", Method: http.MethodPost, Path: "/v1/sessions/{id}/keepalive", Tags: []string{"sessions"},
		Summary:     "Keep a session alive",
		Description: "Renews the session's TTL from now. Send one every TTL/3; 404 means the session ended (expired or deleted) and everything held under it is gone.",
	}, func(ctx context.Context, in *sessionIDPath) (*sessionOutput, error) {
		sess, err := s.session(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		sent := time.Now()
		k, err := s.cli.KeepAliveOnce(ctx, sess.id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.sessions.forget(s.nsOf(ctx), in.ID)
			return nil, sessionGone(in.ID, s.nsOf(ctx))
		}
		if err != nil {
			return nil, problem(err, nil)
		}
		return &sessionOutput{Body: SessionBody{ID: in.ID, Name: sess.name, TTL: k.TTL, ExpiresAt: sent.Add(time.Duration(k.TTL) * time.Second).UTC()}}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "delete-session", Method: http.MethodDelete, Path: "/v1/sessions/{id}", Tags: []string{"sessions"},
		Summary:       "End a session: everything held under it is released at once",
		DefaultStatus: http.StatusNoContent,
	}, func(ctx context.Context, in *sessionIDPath) (*struct{}, error) {
		s.sessions.forget(s.nsOf(ctx), in.ID)
		sess, err := s.session(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		s.sessions.forget(s.nsOf(ctx), in.ID)
		if _, err := s.cli.Revoke(ctx, sess.id); errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, sessionGone(in.ID, s.nsOf(ctx))
		} else if err != nil {
			return nil, problem(err, nil)
		}
		return nil, nil
	})
}

// session reads session id of the request's namespace: 404 when it does
// not exist there (expired, ended, or another namespace's). A session seen
// before is taken from the server's cache without a read: a session's
// namespace and name never change, and etcd itself refuses to bind a key
// to a lease that ended, so a stale entry can only cost a later error
// (mapped to the same 404), never a wrong answer.
func (s *Server) session(ctx context.Context, id string) (*session, error) {
	n, err := strconv.ParseUint(id, 16, 64)
	if err != nil || n == 0 || n > 1<<63-1 {
		return nil, invalid("session", id, "must be a session id: the hex id POST /v1/sessions returned")
	}
	ns := s.nsOf(ctx)
	rec, ok := s.sessions.get(ns, id)
	if !ok {
		if rec, err = s.readSession(ctx, id, clientv3.LeaseID(n)); err != nil {
			return nil, err
		}
		s.sessions.put(ns, id, rec)
	}
	ttl := time.Duration(max(rec.TTL, 1)) * time.Second
	// The session may have been renewed just now: it lasts at most a TTL
	// from now (a renewal resets it to that).
	sess := &session{id: clientv3.LeaseID(n), name: rec.Name}
	sess.lease = lease.Attach(s.cli, sess.id, ttl, time.Now().Add(ttl))
	return sess, nil
}

// readSession reads the record of session id from etcd.
func (s *Server) readSession(ctx context.Context, id string, lid clientv3.LeaseID) (sessionRecord, error) {
	var rec sessionRecord
	g, err := s.cli.Get(ctx, s.keys(ctx).Session(id))
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
		fmt.Sprintf("session %s does not exist in namespace %s: it expired (no keepalive within its TTL), was deleted, or belongs to another namespace; create one with POST /v1/sessions", id, ns))
	p.Errors = []*huma.ErrorDetail{{Location: "session", Value: id, Message: "no such session"}}
	return p
}
