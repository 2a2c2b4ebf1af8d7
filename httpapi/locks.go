package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/paxos"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// LockStatus is a lock as the API shows it.
type LockStatus struct {
	Name    string      `json:"name" doc:"The lock's name."`
	Held    bool        `json:"held" doc:"Whether someone holds it."`
	Token   int64       `json:"token,omitempty" doc:"The holder's fencing token: it strictly increases each time the lock changes hands."`
	Holder  lock.Holder `json:"holder" doc:"Who holds it: its owner or session name, host, pid and since when."`
	TTL     float64     `json:"ttl_left,omitempty" doc:"Seconds the holder's session or lease has left unless renewed; absent when unknown."`
	Waiters int         `json:"waiters" doc:"Contenders queued behind the holder."`
}

func lockStatusOf(st lock.Status) LockStatus {
	out := LockStatus{Name: st.Name, Held: st.Held, Token: st.Token, Holder: st.Holder, Waiters: st.Waiters}
	if st.TTL >= 0 {
		out.TTL = st.TTL.Seconds()
	}
	return out
}

// LockAcquired is the answer to an acquisition.
type LockAcquired struct {
	Status    string      `json:"status" enum:"acquired" doc:"Always acquired (a lock held by another is a 409)."`
	Name      string      `json:"name"`
	Token     int64       `json:"token" doc:"The fencing token: pass it to every write made under the lock, and to release it."`
	Holder    lock.Holder `json:"holder"`
	Session   string      `json:"session,omitempty" doc:"The session the lock is bound to, when one was given."`
	Contender string      `json:"contender" doc:"The holding's key within the lock, a secret of the holder: pass it, with the token, to release."`
	ExpiresAt time.Time   `json:"expires_at" doc:"When the lock frees itself unless the session is kept alive (an owner lock is never renewed)."`
}

type lockPath struct {
	Name string `path:"name" minLength:"1" maxLength:"128" doc:"The lock's name."`
}

type acquireInput struct {
	Name string `path:"name" minLength:"1" maxLength:"128" doc:"The lock's name."`
	Wait string `query:"wait" doc:"How long to wait in line for the lock (Go duration: 10s, 500ms); without it one attempt is made."`
	Body struct {
		Session string `json:"session,omitempty" doc:"Bind the lock to this session: it is held until released or the session ends."`
		Owner   string `json:"owner,omitempty" maxLength:"128" doc:"With ttl and no session: who holds the lock (the lock service's form)."`
		TTL     int64  `json:"ttl,omitempty" minimum:"1" maximum:"86400" doc:"With owner: seconds the lock lasts; it is not renewed."`
	}
	RawBody []byte
}

type releaseInput struct {
	Name    string `path:"name" minLength:"1" maxLength:"128" doc:"The lock's name."`
	Token   int64  `query:"token" required:"true" minimum:"1" doc:"The fencing token the acquisition returned."`
	Session string `query:"session" doc:"The session the lock was acquired under (checked against the contender)."`
	Owner   string `query:"owner" doc:"The owner named at acquisition, for a lock taken with owner and ttl (instead of the session): it must be the holder's, and the lock's lease is revoked with the release."`
	// Contender proves the holding, with the token.
	Contender string `query:"contender" required:"true" doc:"The contender the acquisition returned: with the token it proves the holding."`
}

type lockStatusOutput struct{ Body LockStatus }

func (s *Server) lockRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "acquire-lock", Method: http.MethodPost, Path: "/v1/locks/{name}", Tags: []string{"locks"},
		Summary: "Acquire a lock",
		Description: "Give a session (the lock lasts as long as it) or an owner and a ttl. 200 with the fencing token; 409 with the holder " +
			"when held by another; ?wait=10s waits in line, first come first served.",
		Errors: []int{http.StatusConflict, http.StatusNotFound},
	}, s.acquireLock)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-lock", Method: http.MethodGet, Path: "/v1/locks/{name}", Tags: []string{"locks"},
		Summary: "Who holds a lock; 404 when nobody does.",
		Errors:  []int{http.StatusNotFound},
	}, s.lockStatus)
	huma.Register(s.api, huma.Operation{
		OperationID: "release-lock", Method: http.MethodDelete, Path: "/v1/locks/{name}", Tags: []string{"locks"},
		Summary:       "Release a lock held with a token",
		Description:   "The token and the session (or owner) it was acquired with; 409 when the lock is not held with that token.",
		DefaultStatus: http.StatusNoContent,
		Errors:        []int{http.StatusConflict},
	}, s.releaseLock)
	s.serviceLockRoutes()
	huma.Register(s.api, huma.Operation{
		OperationID: "list-locks", Method: http.MethodGet, Path: "/v1/locks", Tags: []string{"locks"},
		Summary: "Every held lock, by name",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body []LockStatus }, error) {
		l, err := s.locker(ctx, nil, lock.Holder{})
		if err != nil {
			return nil, err
		}
		defer l.Close(context.WithoutCancel(ctx))
		sts, err := l.List(ctx)
		if err != nil {
			return nil, problem(err, nil)
		}
		out := make([]LockStatus, len(sts))
		for i, st := range sts {
			out[i] = lockStatusOf(st)
		}
		return &struct{ Body []LockStatus }{out}, nil
	})
}

// locker is a locker of the request's namespace on l (nil: an attached
// placeholder for reads, which bind nothing), its holdings recorded as
// holder's (the client's: its session's name and host, or the owner it
// named).
func (s *Server) locker(ctx context.Context, l *lease.Lease, holder lock.Holder) (*lock.Etcd, error) {
	if l == nil {
		l = lease.Attach(s.cli, clientv3.NoLease, time.Second, time.Now().Add(time.Minute))
	}
	e, err := lock.NewEtcd(ctx, s.cli, lock.EtcdConfig{Namespace: s.nsOf(ctx), Lease: l, Holder: holder, Logger: s.cfg.Logger, Batcher: s.locks})
	if err != nil {
		return nil, problem(err, nil)
	}
	return e, nil
}

// wait parses a wait bound ("" is none), capped at the server's MaxWait.
func (s *Server) wait(location, v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, invalid(location, v, "must be a duration such as 10s or 500ms")
	}
	return min(d, s.cfg.MaxWait), nil
}

func (s *Server) acquireLock(ctx context.Context, in *acquireInput) (*struct{ Body LockAcquired }, error) {
	if err := checkLockName(in.Name); err != nil {
		return nil, err
	}
	wait, err := s.wait("query.wait", in.Wait)
	if err != nil {
		return nil, err
	}
	b := in.Body
	l, holder, expires, own, err := s.lockBinding(ctx, in)
	if err != nil {
		return nil, err
	}
	locker, err := s.locker(ctx, l, holder)
	if err != nil {
		return nil, err
	}
	defer locker.Close(context.WithoutCancel(ctx))
	var held *lock.EtcdLock
	if wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, wait)
		held, err = locker.AcquireFenced(wctx, in.Name)
		ranOut := wctx.Err() != nil
		cancel()
		var he *lock.HeldError
		if err != nil && ranOut && ctx.Err() == nil && !errors.As(err, &he) {
			// The wait ran out before etcd answered the first attempt
			// (a wait of a few ms): answer as an attempt without a wait.
			held, err = locker.TryAcquireFenced(ctx, in.Name)
		}
	} else {
		held, err = locker.TryAcquireFenced(ctx, in.Name)
	}
	if err != nil {
		if own != 0 {
			s.revokeGranted(ctx, own)
		}
		if errors.Is(err, lease.ErrLost) && b.Session != "" {
			return nil, sessionGone(b.Session, s.nsOf(ctx))
		}
		return nil, problem(err, nil)
	}
	if err := ctx.Err(); err != nil {
		// Granted after the client stopped waiting (a batch sent for
		// several callers ends on its own): nobody would learn the token
		// and the contender, and the lock would stay held by the session
		// until it ends. Let it go.
		c, cancel := cleanupContext(ctx)
		_ = held.Release(c)
		cancel()
		if own != 0 {
			s.revokeGranted(ctx, own)
		}
		return nil, problem(err, nil)
	}
	_, contender, _ := s.keys(ctx).ParseLockContender(held.Key())
	return &struct{ Body LockAcquired }{LockAcquired{Status: "acquired", Name: in.Name, Token: held.Token(), Holder: held.Holder(), Session: b.Session,
		Contender: contender, ExpiresAt: expires.UTC()}}, nil
}

// lockForRun takes lock name under session as POST /v1/locks/{name} does,
// waiting in line up to wait: the Agent Server's run start takes its
// thread's lock with it.
func (s *Server) lockForRun(ctx context.Context, session, name string, wait time.Duration) (agentserver.RunLock, error) {
	in := &acquireInput{Name: name}
	in.Body.Session = session
	if wait > 0 {
		in.Wait = wait.String()
	}
	out, err := s.acquireLock(ctx, in)
	if err != nil {
		return agentserver.RunLock{}, err
	}
	a := out.Body
	lid, _, _, _ := parseSessionID(session) // taken under it: a session id, its secret proven
	return agentserver.RunLock{Status: a.Status, Name: a.Name, Token: a.Token, Holder: a.Holder, Session: a.Session, Contender: a.Contender, ExpiresAt: a.ExpiresAt, Lease: lid}, nil
}

// lockBinding is what an acquisition binds its lock to: the session's
// lease and holder, or, for an owner and a ttl, a lease granted for this
// lock alone (own, which the caller revokes if the lock is not taken).
func (s *Server) lockBinding(ctx context.Context, in *acquireInput) (l *lease.Lease, holder lock.Holder, expires time.Time, own clientv3.LeaseID, err error) {
	b := in.Body
	switch {
	case b.Session != "" && (b.Owner != "" || b.TTL != 0):
		return nil, holder, expires, 0, invalid("body.session", b.Session, "give a session, or an owner and a ttl, not both")
	case b.Session != "":
		sess, err := s.session(ctx, "body.session", b.Session)
		if err != nil {
			return nil, holder, expires, 0, err
		}
		return sess.lease, sess.holder(), sess.lease.Deadline(), 0, nil
	case b.Owner != "" && b.TTL > 0:
		var raw struct{ Owner json.RawMessage }
		if json.Unmarshal(in.RawBody, &raw) == nil && paxos.ReplacedInvalidText(b.Owner, raw.Owner) {
			return nil, holder, expires, 0, invalid("body.owner", b.Owner, "must be UTF-8 text: it holds bytes that are not UTF-8 (or a \\u escape of a lone surrogate)")
		}
		sent := time.Now()
		g, err := s.grant(ctx, b.TTL)
		if err != nil {
			return nil, holder, expires, 0, problem(fmt.Errorf("grant the lock's %d s lease: %w", b.TTL, err), nil)
		}
		expires = sent.Add(time.Duration(g.TTL) * time.Second)
		return lease.Attach(s.cli, g.ID, time.Duration(g.TTL)*time.Second, expires), lock.Holder{ID: b.Owner}, expires, g.ID, nil
	default:
		return nil, holder, expires, 0, invalid("body", nil, "give a session, or an owner and a ttl (seconds)")
	}
}

func (s *Server) lockStatus(ctx context.Context, in *lockPath) (*lockStatusOutput, error) {
	if err := lock.CheckName(in.Name); err != nil {
		return nil, problem(err, map[string]string{"name": "path.name"})
	}
	l, err := s.locker(ctx, nil, lock.Holder{})
	if err != nil {
		return nil, err
	}
	defer l.Close(context.WithoutCancel(ctx))
	st, err := l.Status(ctx, in.Name)
	if err != nil {
		return nil, problem(err, nil)
	}
	if !st.Held {
		return nil, newProblem(http.StatusNotFound, "lock-not-held", fmt.Sprintf("lock %q is not held", in.Name))
	}
	return &lockStatusOutput{Body: lockStatusOf(st)}, nil
}

func (s *Server) releaseLock(ctx context.Context, in *releaseInput) (*struct{}, error) {
	if err := checkLockName(in.Name); err != nil {
		return nil, err
	}
	if in.Session != "" && in.Owner != "" {
		return nil, invalid("query.session", in.Session, "give the session or the owner the lock was acquired with, not both")
	}
	if in.Contender == "" {
		return nil, invalid("query.contender", nil, "is required: the contender the acquisition returned (with the token, it proves the holding)")
	}
	// The contender's name starts with the lease it was created under (a
	// key's name never changes), and its random part is known only to the
	// client that acquired it: with the token it proves the holding.
	lid, ok := keyspace.ContenderLease(in.Contender)
	if !ok {
		return nil, invalid("query.contender", in.Contender, "must be the contender the acquisition returned")
	}
	if in.Session != "" {
		id, _, _, ok := parseSessionID(in.Session)
		if !ok || int64(id) != lid {
			return nil, invalid("query.contender", in.Contender, "must be a contender of the session's own, as the acquisition returned it")
		}
	}
	if in.Session == "" && in.Owner == "" {
		return nil, invalid("query.session", nil, "give the session (or, for a lock taken with owner and ttl, the owner) the lock was acquired with: a release names the holder it releases")
	}
	l, err := s.locker(ctx, nil, lock.Holder{})
	if err != nil {
		return nil, err
	}
	defer l.Close(context.WithoutCancel(ctx))
	var own clientv3.LeaseID
	if in.Owner != "" {
		// The holding must be the owner's: the key's record names its
		// holder, and it never changes while the key lives.
		g, err := s.cli.Get(ctx, s.keys(ctx).LockContender(in.Name, in.Contender))
		if err != nil {
			return nil, problem(fmt.Errorf("read the holding of lock %s: %w", in.Name, err), nil)
		}
		var h lock.Holder
		if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != in.Token || json.Unmarshal(g.Kvs[0].Value, &h) != nil || h.ID != in.Owner {
			return nil, s.notHeld(ctx, l, in.Name, fmt.Sprintf("lock %s is not held by owner %q with token %d: nothing was released", in.Name, in.Owner, in.Token))
		}
		own = clientv3.LeaseID(g.Kvs[0].Lease)
	}
	if err := l.ReleaseContender(ctx, in.Name, in.Contender, in.Token); err != nil {
		var nh *lock.NotHeldError
		if errors.As(err, &nh) {
			return nil, s.notHeld(ctx, l, in.Name, err.Error()+": nothing was released")
		}
		return nil, problem(err, nil)
	}
	// An owner lock's lease was granted for it alone: give it back.
	etcdTable{s}.revokeOwn(ctx, own, in.Name)
	return nil, nil
}

// notHeld is the 409 of a release refused, with the lock's holder when
// it has one.
func (s *Server) notHeld(ctx context.Context, l *lock.Etcd, name, detail string) error {
	p := newProblem(http.StatusConflict, "lock-not-held", detail)
	if st, err := l.Status(ctx, name); err == nil && st.Held {
		ls := lockStatusOf(st)
		p.Holder = &ls
	}
	return p
}

// checkLockName checks a lock name of the API: a valid name, and not one
// of the task runner's locks ("task:ID"), which are taken only through the
// agent-task routes (their claim also checks that no queue worker runs the
// task).
func checkLockName(name string) error {
	if err := lock.CheckName(name); err != nil {
		return problem(err, map[string]string{"name": "path.name"})
	}
	if keyspace.IsTaskLock(name) {
		return invalid("path.name", name, "must not start with \"task:\": agent tasks are claimed with POST /v1/agent-tasks/{id}/claim")
	}
	return nil
}

// maxWaitersShown bounds the waiters a lock's line lists.
const maxWaitersShown = 100

// LockContender is one holding of a lock or one place in its line.
type LockContender struct {
	Position int         `json:"position" doc:"0 for the holder; 1 for the next in line, and so on."`
	Holder   lock.Holder `json:"holder" doc:"Who: its owner or session name, host, pid, and when it took the lock or joined the line."`
	Token    int64       `json:"token" doc:"Its fencing token: the holder's, or the one a waiter gets when its turn comes."`
	TTL      float64     `json:"ttl_left,omitempty" doc:"Seconds its session or lease has left unless renewed; absent when unknown."`
}

// LockLine is a lock's holder and the contenders waiting behind it.
type LockLine struct {
	Name    string          `json:"name" doc:"The lock's name."`
	Holder  *LockContender  `json:"holder,omitempty" doc:"Who holds it; absent when nobody does."`
	Waiters []LockContender `json:"waiters" doc:"The contenders queued behind the holder, first come first served (at most 100)."`
	Total   int             `json:"total_waiters" doc:"How many wait in all."`
}

func (s *Server) waiterRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "lock-waiters", Method: http.MethodGet, Path: "/v1/locks/{name}/waiters", Tags: []string{"locks"},
		Summary: "A lock's holder and the contenders waiting in line behind it",
		Description: "In the order they get the lock. Contenders are named by their holder records, never by their keys (which, " +
			"with the token, would release the lock). An empty line when nobody holds or waits.",
	}, s.lockWaiters)
}

func (s *Server) lockWaiters(ctx context.Context, in *lockPath) (*struct{ Body LockLine }, error) {
	if err := lock.CheckName(in.Name); err != nil {
		return nil, problem(err, map[string]string{"name": "path.name"})
	}
	g, err := s.cli.Get(ctx, s.keys(ctx).Lock(in.Name), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, problem(fmt.Errorf("read the line of lock %s: %w", in.Name, err), nil)
	}
	out := LockLine{Name: in.Name, Waiters: []LockContender{}}
	for i, kv := range g.Kvs {
		if i > maxWaitersShown {
			break
		}
		c := LockContender{Position: i, Token: kv.CreateRevision}
		if err := json.Unmarshal(kv.Value, &c.Holder); err != nil {
			c.Holder.ID = "unknown (unreadable record)"
		}
		if kv.Lease != 0 {
			if ttl, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL >= 0 {
				c.TTL = float64(ttl.TTL)
			}
		}
		if i == 0 {
			out.Holder = &c
			continue
		}
		out.Waiters = append(out.Waiters, c)
	}
	out.Total = max(len(g.Kvs)-1, 0)
	return &struct{ Body LockLine }{out}, nil
}
