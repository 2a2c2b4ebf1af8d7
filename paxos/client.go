package paxos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors of the Client. Each answer the API gives maps to one; typed
// errors carry the details.
var (
	// ErrHeld: another owner holds the lock (*HeldError).
	ErrHeld = errors.New("paxos: lock held by another owner")
	// ErrNotHeld: the owner and token do not hold the lock (*NotHeldError).
	ErrNotHeld = errors.New("paxos: lock not held with this owner and token")
	// ErrNotFound: nobody holds the lock.
	ErrNotFound = errors.New("paxos: lock not found or expired")
	// ErrBadRequest: the node refused the request as malformed (*APIError).
	ErrBadRequest = errors.New("paxos: bad request")
	// ErrUnreachable: no endpoint answered.
	ErrUnreachable = errors.New("paxos: no node answered")
)

// HeldError says who holds a lock that could not be taken.
type HeldError struct {
	Lock   string
	Holder LockInfo
}

// Error implements error.
func (e *HeldError) Error() string {
	return fmt.Sprintf("paxos: lock %q is held by owner %q with token %d", e.Lock, e.Holder.Owner, e.Holder.Token)
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// NotHeldError says that a release or renewal named an owner and token
// that do not hold the lock.
type NotHeldError struct {
	Lock  string
	Token uint64
	// Current is the holder when the lock is held by someone else, nil
	// when it is free.
	Current *LockInfo
}

// Error implements error.
func (e *NotHeldError) Error() string {
	if e.Current == nil {
		return fmt.Sprintf("paxos: lock %q is not held with token %d: it is free", e.Lock, e.Token)
	}
	return fmt.Sprintf("paxos: lock %q is not held with token %d: owner %q holds it with token %d", e.Lock, e.Token, e.Current.Owner, e.Current.Token)
}

// Unwrap returns ErrNotHeld.
func (e *NotHeldError) Unwrap() error { return ErrNotHeld }

// APIError is an answer the client has no better error for: the status
// and the node's message. A 504 matches ErrTimeout, a 400 ErrBadRequest.
type APIError struct {
	Endpoint   string
	StatusCode int
	Message    string
}

// Error implements error.
func (e *APIError) Error() string {
	return fmt.Sprintf("paxos: %s answered %d: %s", e.Endpoint, e.StatusCode, e.Message)
}

// Unwrap returns ErrTimeout for a 504 and ErrBadRequest for a 400.
func (e *APIError) Unwrap() error {
	switch e.StatusCode {
	case http.StatusGatewayTimeout:
		return ErrTimeout
	case http.StatusBadRequest:
		return ErrBadRequest
	}
	return nil
}

// ClientConfig configures a Client.
type ClientConfig struct {
	// Endpoints are the nodes' API addresses: host:port, or a URL with
	// http or https. At least one.
	Endpoints []string
	// HTTPClient sends the requests; nil means one with a 2 s dial
	// timeout and no proxy. Bound each call with its context.
	HTTPClient *http.Client
}

// Client calls the REST API of a group. Any node serves any request, so it
// sends each request to the leader, when the last answer named it
// (LeaderHeader) by the address of one of the endpoints, and otherwise to
// the node that last answered (a follower forwards a request to the
// leader and answers once it applied it: two hops more). It fails over to
// the next one when a node cannot be reached, is stopping (503) or has no
// quorum (504); it does not fail over on a 4xx answer, which any node
// would give. Requests that change state carry an Idempotency-Key, the
// same on every endpoint tried, so a request whose answer was lost is
// applied once. Safe for concurrent use.
type Client struct {
	endpoints []string
	hosts     []string // each endpoint's host:port
	// failed is when each endpoint last failed a request (UnixNano).
	failed []atomic.Int64
	hc     *http.Client
	own    bool
	next   atomic.Uint32
}

// NewClient returns a client of the nodes at cfg.Endpoints. It contacts
// nothing.
func NewClient(cfg ClientConfig) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("paxos: client needs at least one endpoint")
	}
	c := &Client{hc: cfg.HTTPClient}
	for _, e := range cfg.Endpoints {
		u, err := ParseEndpoint(e)
		if err != nil {
			return nil, err
		}
		c.endpoints = append(c.endpoints, u)
		c.hosts = append(c.hosts, u[strings.Index(u, "://")+3:])
	}
	c.failed = make([]atomic.Int64, len(c.endpoints))
	if c.hc == nil {
		c.own = true
		c.hc = &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	return c, nil
}

// ParseEndpoint checks an endpoint (host:port, or an http or https URL of
// one) and returns its base URL.
func ParseEndpoint(e string) (string, error) {
	e = strings.TrimSpace(e)
	raw := e
	if !strings.Contains(e, "://") {
		raw = "http://" + e
	}
	u, err := url.Parse(raw)
	if err == nil && (u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "") {
		err = errors.New("want host:port or http://host:port")
	}
	if err == nil {
		_, err = strconv.ParseUint(u.Port(), 10, 16)
	}
	if err != nil {
		return "", fmt.Errorf("paxos: endpoint %q: %w", e, err)
	}
	return u.Scheme + "://" + u.Host, nil
}

// Endpoints returns the base URLs the client sends to.
func (c *Client) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// Close releases idle connections of a client NewClient made.
func (c *Client) Close() {
	if c.own {
		c.hc.CloseIdleConnections()
	}
}

// AcquireRequest asks for a lock.
type AcquireRequest struct {
	// Owner names the holder; release and renew must repeat it.
	Owner string
	// TTL is how long the grant lasts unless renewed (1 ms to 24 h).
	TTL time.Duration
	// Holder is an optional JSON object stored with the grant and shown
	// to whoever reads the lock.
	Holder json.RawMessage
}

// Acquire makes one attempt to take lock id. When another owner holds it
// the error is a *HeldError.
func (c *Client) Acquire(ctx context.Context, id string, req AcquireRequest) (LockInfo, error) {
	body := map[string]any{"owner": req.Owner, "ttl": req.TTL.Seconds()}
	if len(req.Holder) > 0 {
		body["holder"] = req.Holder
	}
	ans, err := c.do(ctx, http.MethodPost, "/locks/"+url.PathEscape(id), body)
	if err != nil {
		return LockInfo{}, err
	}
	switch ans.status {
	case http.StatusOK:
		var r AcquireResponse
		if err := ans.decode(&r); err != nil {
			return LockInfo{}, err
		}
		d := r.Details
		return LockInfo{LockID: id, Owner: d.Owner, Token: r.Token, Acquired: d.Acquired, Expires: d.Expires, TTL: req.TTL.Seconds(), Holder: d.Holder}, nil
	case http.StatusConflict:
		var r struct{ Holder LockInfo }
		if err := ans.decode(&r); err != nil {
			return LockInfo{}, err
		}
		return LockInfo{}, &HeldError{Lock: id, Holder: r.Holder}
	}
	return LockInfo{}, ans.err()
}

// Get reads lock id through the log. A free lock is ErrNotFound.
func (c *Client) Get(ctx context.Context, id string) (LockInfo, error) {
	ans, err := c.do(ctx, http.MethodGet, "/locks/"+url.PathEscape(id), nil)
	if err != nil {
		return LockInfo{}, err
	}
	switch ans.status {
	case http.StatusOK:
		var li LockInfo
		return li, ans.decode(&li)
	case http.StatusNotFound:
		return LockInfo{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return LockInfo{}, ans.err()
}

// Release frees lock id if owner holds it with token; otherwise the error
// is a *NotHeldError and nothing changes.
func (c *Client) Release(ctx context.Context, id, owner string, token uint64) error {
	ans, err := c.do(ctx, http.MethodDelete, "/locks/"+url.PathEscape(id), map[string]any{"owner": owner, "token": token})
	if err != nil {
		return err
	}
	switch ans.status {
	case http.StatusOK:
		return nil
	case http.StatusConflict:
		return ans.notHeld(id, token)
	}
	return ans.err()
}

// Renew extends lock id by ttl from now (the leader's clock) if owner
// holds it with token; otherwise the error is a *NotHeldError. The answer
// has the new Expires.
func (c *Client) Renew(ctx context.Context, id, owner string, token uint64, ttl time.Duration) (LockInfo, error) {
	ans, err := c.do(ctx, http.MethodPost, "/locks/"+url.PathEscape(id)+"/renew", map[string]any{"owner": owner, "token": token, "ttl": ttl.Seconds()})
	if err != nil {
		return LockInfo{}, err
	}
	switch ans.status {
	case http.StatusOK:
		var r struct {
			Expires int64
			Token   uint64
		}
		if err := ans.decode(&r); err != nil {
			return LockInfo{}, err
		}
		return LockInfo{LockID: id, Owner: owner, Token: r.Token, Expires: r.Expires, TTL: ttl.Seconds()}, nil
	case http.StatusConflict:
		return LockInfo{}, ans.notHeld(id, token)
	}
	return LockInfo{}, ans.err()
}

// List returns every held lock, ordered by id.
func (c *Client) List(ctx context.Context) ([]LockInfo, error) {
	ans, err := c.do(ctx, http.MethodGet, "/locks", nil)
	if err != nil {
		return nil, err
	}
	if ans.status != http.StatusOK {
		return nil, ans.err()
	}
	var r struct{ Data []LockInfo }
	return r.Data, ans.decode(&r)
}

// Status returns the view of the first node that answers.
func (c *Client) Status(ctx context.Context) (NodeStatus, error) {
	ans, err := c.do(ctx, http.MethodGet, "/status", nil)
	if err != nil {
		return NodeStatus{}, err
	}
	if ans.status != http.StatusOK {
		return NodeStatus{}, ans.err()
	}
	var st NodeStatus
	return st, ans.decode(&st)
}

// EndpointStatus is one node's answer to StatusAll.
type EndpointStatus struct {
	Endpoint string
	Status   NodeStatus
	// Err is why the node did not answer.
	Err error
}

// StatusAll asks every endpoint at once for its view, in endpoint order.
func (c *Client) StatusAll(ctx context.Context) []EndpointStatus {
	out := make([]EndpointStatus, len(c.endpoints))
	var wg sync.WaitGroup
	for i, ep := range c.endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].Endpoint = ep
			ans, err := c.send(ctx, ep, http.MethodGet, "/status", nil, "")
			switch {
			case err != nil:
				out[i].Err = err
			case ans.status != http.StatusOK:
				out[i].Err = ans.err()
			default:
				out[i].Err = ans.decode(&out[i].Status)
			}
		}()
	}
	wg.Wait()
	return out
}

// AddNode adds p to the group through the log.
func (c *Client) AddNode(ctx context.Context, p Peer) error {
	ans, err := c.do(ctx, http.MethodPost, "/members", map[string]any{"id": p.ID, "addr": p.Addr})
	if err != nil {
		return err
	}
	if ans.status != http.StatusOK {
		return ans.err()
	}
	return nil
}

// RemoveNode removes node id from the group through the log.
func (c *Client) RemoveNode(ctx context.Context, id NodeID) error {
	ans, err := c.do(ctx, http.MethodDelete, "/members/"+strconv.FormatUint(uint64(id), 10), nil)
	if err != nil {
		return err
	}
	if ans.status != http.StatusOK {
		return ans.err()
	}
	return nil
}

// answer is a node's answer.
type answer struct {
	endpoint string
	status   int
	body     []byte
	leader   string // the LeaderHeader, host:port
}

// maxAnswerBytes bounds an answer (a list of many locks).
const maxAnswerBytes = 64 << 20

func (a answer) decode(v any) error {
	if err := json.Unmarshal(a.body, v); err != nil {
		return fmt.Errorf("paxos: %s answered %d with a body that is not the API's JSON: %w", a.endpoint, a.status, err)
	}
	return nil
}

// err is the APIError of an answer.
func (a answer) err() error {
	var e struct{ Error string }
	if json.Unmarshal(a.body, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(a.body))
	}
	return &APIError{Endpoint: a.endpoint, StatusCode: a.status, Message: e.Error}
}

// notHeld is the NotHeldError of a 409.
func (a answer) notHeld(id string, token uint64) error {
	var r struct{ Holder *LockInfo }
	if err := a.decode(&r); err != nil {
		return err
	}
	return &NotHeldError{Lock: id, Token: token, Current: r.Holder}
}

// do sends a request, failing over from endpoint to endpoint, starting
// with the leader the last answer named (when it is an endpoint that did
// not fail in that call) or else the one that answered last. It moves on when a node cannot be
// reached, is stopping (502, 503) or found no quorum (504): a node cut off
// from the majority must not hold up a client that reaches the others.
// When ctx has a deadline, each attempt but the last gets an equal share
// of the time left, so a node that hangs costs its share only.
func (c *Client) do(ctx context.Context, method, path string, body any) (answer, error) {
	var key string
	if method != http.MethodGet {
		var b [16]byte
		_, _ = rand.Read(b[:])
		key = hex.EncodeToString(b[:])
	}
	start := int(c.next.Load())
	var (
		errs    []string
		timeout *answer
	)
	for i := range c.endpoints {
		n := (start + i) % len(c.endpoints)
		actx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok && i < len(c.endpoints)-1 {
			actx, cancel = context.WithTimeout(ctx, time.Until(dl)/time.Duration(len(c.endpoints)-i))
		}
		ans, err := c.send(actx, c.endpoints[n], method, path, body, key)
		cancel()
		if err == nil && ans.status != http.StatusServiceUnavailable && ans.status != http.StatusBadGateway && ans.status != http.StatusGatewayTimeout {
			c.next.Store(uint32(c.leaderOr(ans.leader, n)))
			return ans, nil
		}
		if ctx.Err() != nil {
			return answer{}, fmt.Errorf("paxos: %s %s: %w", method, path, context.Cause(ctx))
		}
		c.failed[n].Store(time.Now().UnixNano())
		if err == nil {
			if ans.status == http.StatusGatewayTimeout {
				timeout = &ans
			}
			err = ans.err()
		}
		errs = append(errs, err.Error())
	}
	if timeout != nil {
		return *timeout, nil
	}
	return answer{}, fmt.Errorf("%w (%s %s): %s", ErrUnreachable, method, path, strings.Join(errs, "; "))
}

// leaderRetry is how long the client does not follow a node's word that
// the leader is an endpoint that failed it: the other nodes may name a
// leader that this client cannot reach (or that just died) for a while.
const leaderRetry = 5 * time.Second

// leaderOr is the index of the endpoint at leader (host:port, as a node
// names it in LeaderHeader), or n if none is, or if that endpoint failed
// a request in the last leaderRetry: the next request goes straight to
// the leader when the client knows it by that address and reaches it.
func (c *Client) leaderOr(leader string, n int) int {
	if leader == "" {
		return n
	}
	for i, h := range c.hosts {
		if h == leader {
			if time.Since(time.Unix(0, c.failed[i].Load())) < leaderRetry {
				return n
			}
			return i
		}
	}
	return n
}

// send makes one request to one endpoint.
func (c *Client) send(ctx context.Context, endpoint, method, path string, body any, key string) (answer, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{}, fmt.Errorf("paxos: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, endpoint+path, rd)
	if err != nil {
		return answer{}, fmt.Errorf("paxos: %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(IdempotencyHeader, key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the method and URL are said here
		}
		return answer{}, fmt.Errorf("paxos: %s %s%s: %w", method, endpoint, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return answer{}, fmt.Errorf("paxos: read answer of %s %s%s: %w", method, endpoint, path, err)
	}
	return answer{endpoint: endpoint, status: resp.StatusCode, body: b, leader: resp.Header.Get(LeaderHeader)}, nil
}
