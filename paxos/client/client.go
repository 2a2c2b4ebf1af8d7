package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Client.
type Config struct {
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

	closeOnce sync.Once
}

// New returns a client of the nodes at cfg.Endpoints. It contacts
// nothing.
func New(cfg Config) (*Client, error) {
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

// Close ends the client's lifecycle; calling it again does nothing and
// returns nil.
//
// Shutdown order: calls in flight are not waited for (each ends with its
// own context), and Close does not release locks: release what you hold
// first. Then Close drops the idle connections of the HTTP client New
// made (one passed in Config.HTTPClient is left alone). A call made after
// Close still works and opens connections again. ctx bounds nothing today,
// as Close does not block.
func (c *Client) Close(ctx context.Context) error {
	c.closeOnce.Do(func() {
		if c.own {
			c.hc.CloseIdleConnections()
		}
	})
	return nil
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
	body := AcquireBody{Owner: ptr(req.Owner), TTL: ptr(req.TTL.Seconds())}
	if len(req.Holder) > 0 {
		body.Holder = ptr(json.RawMessage(req.Holder))
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
		var r ErrorResponse
		if err := ans.decode(&r); err != nil {
			return LockInfo{}, err
		}
		if r.Holder == nil {
			r.Holder = &LockInfo{LockID: id}
		}
		return LockInfo{}, &HeldError{Lock: id, Holder: *r.Holder}
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
	ans, err := c.do(ctx, http.MethodDelete, "/locks/"+url.PathEscape(id), OwnerTokenBody{Owner: &owner, Token: &token})
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
	ans, err := c.do(ctx, http.MethodPost, "/locks/"+url.PathEscape(id)+"/renew", OwnerTokenBody{Owner: &owner, Token: &token, TTL: ptr(ttl.Seconds())})
	if err != nil {
		return LockInfo{}, err
	}
	switch ans.status {
	case http.StatusOK:
		var r RenewResponse
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
	var r ListResponse
	err = ans.decode(&r)
	return r.Data, err
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
